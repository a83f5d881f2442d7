"""Register ``mncore`` as a real torch device (PrivateUse1 renamed, Python backend)."""
from __future__ import annotations

from typing import Any

import torch

from mncore.trace import autocast, conversion, device_module
from mncore.trace.dispatch import factory, upload_dense, upload_kernel
from mncore.trace.tensor import DEVICE_NAME, LazyTensor

aten = torch.ops.aten

# Factories with no tensor argument reach the PrivateUse1 kernel instead of __torch_dispatch__.
# Composite factories (zeros, ones, full, rand, randn, ...) decompose into these plus in-place ops.
FACTORIES = (
    aten.empty.memory_format, aten.empty_strided.default, aten.arange.default, aten.arange.start,
    aten.arange.start_step, aten.linspace.default, aten.logspace.default, aten.eye.default, aten.eye.m,
    aten.randperm.default, aten.randperm.generator, aten.scalar_tensor.default, aten.full.default,
    aten.zeros.default, aten.ones.default, aten.tril_indices.default, aten.triu_indices.default,
)


_lib: Any = None
_fallback_lib: Any = None


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """matmul without its in-place squeeze_ for 1-D operands (lazy tensor metadata is immutable).

    Registered for AutogradPrivateUse1 so that it composes differentiable ops like the
    CompositeImplicitAutograd kernel it replaces.
    """
    if a.dim() == 1 and b.dim() >= 2:
        return aten.matmul.default.decompose(a.unsqueeze(0), b).squeeze(-2)
    if b.dim() == 1 and a.dim() >= 2:
        return aten.matmul.default.decompose(a, b.unsqueeze(-1)).squeeze(-1)
    return aten.matmul.default.decompose(a, b)


def _fused_lstm_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
                     input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None) -> tuple:
    """LSTM cell from differentiable ops: torch picks the fused (CUDA-only) cell for non-CPU devices."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def _fused_gru_cell(input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
                    input_bias: torch.Tensor | None = None, hidden_bias: torch.Tensor | None = None) -> tuple:
    """GRU cell from differentiable ops (same reason as the LSTM cell)."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, ii, in_ = input_gates.chunk(3, 1)
    hr, hi, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, in_, hn, n], 1)


def _gru(input: torch.Tensor, hx: torch.Tensor, params: list, has_biases: bool, num_layers: int, dropout: float,
         train: bool, bidirectional: bool, batch_first: bool) -> tuple:
    """``aten::gru.input`` without the in-place ``transpose_`` ATen's composite applies for batch_first."""
    if batch_first:
        input = input.transpose(0, 1)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    last_h, layer_in = [], input
    for layer in range(num_layers):
        outs_by_dir = []
        for d in range(dirs):
            i = (layer * dirs + d) * per
            w_ih, w_hh = params[i], params[i + 1]
            b_ih, b_hh = (params[i + 2], params[i + 3]) if has_biases else (None, None)
            h = hx[layer * dirs + d]
            steps = range(layer_in.shape[0])
            outs: list = [None] * layer_in.shape[0]
            for t in (steps if d == 0 else reversed(steps)):
                h, _ = _fused_gru_cell(torch.nn.functional.linear(layer_in[t], w_ih, b_ih),
                                       torch.nn.functional.linear(h, w_hh, b_hh), h)
                outs[t] = h
            outs_by_dir.append(torch.stack(outs))
            last_h.append(h)
        layer_in = torch.cat(outs_by_dir, -1) if dirs == 2 else outs_by_dir[0]
        if dropout and train and layer < num_layers - 1:
            layer_in = torch.nn.functional.dropout(layer_in, dropout, True)
    return (layer_in.transpose(0, 1) if batch_first else layer_in), torch.stack(last_h)


def _efficient_zeros(size: list, *, dtype: Any = None, layout: Any = None, device: Any = None,
                     pin_memory: Any = None) -> torch.Tensor:
    """``_efficientzerotensor`` (autograd's zero gradients, e.g. of ``sgn``): plain zeros on mncore."""
    return torch.zeros(size, dtype=dtype, device=DEVICE_NAME)


def _tensor_split(self: torch.Tensor, tensor_indices_or_sections: torch.Tensor, dim: int = 0) -> tuple:
    """``tensor_split`` with a tensor of indices: ATen wants it on the CPU; one on mncore is read to the host
    (its values are the split points, as they are for a CPU tensor)."""
    split = tensor_indices_or_sections.cpu()
    if split.dim() == 0:
        return aten.tensor_split.sections(self, int(split), dim)
    return aten.tensor_split.indices(self, split.tolist(), dim)


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``copy_`` reaching the backend kernel (Python key excluded, e.g. inside ``torch.tensor``)."""
    LazyTensor.__torch_dispatch__(aten.copy_.default, (), (dst, src), {})
    return dst


# Ops with a fused CPU/CUDA kernel and a CompositeImplicitAutograd fallback. Without a kernel of its own,
# mncore would get the fallback's steps, each rounded to a 16-bit input's dtype, where CPU computes in
# float32 and rounds once (bfloat16 SiLU/Mish gradients then differ from eager's by several ulps).
FUSED_ON_CPU = ("silu_backward", "mish_backward")


def _traced_whole(op: Any) -> Any:
    """A PrivateUse1 kernel that sends ``op`` to the tracer as one op (its registration is what stops the
    decomposition; tensors reach it through ``__torch_dispatch__`` first)."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return LazyTensor.__torch_dispatch__(op, (), args, kwargs)
    return kernel


def _no_pinning_for_mncore() -> None:
    """``DataLoader(pin_memory=True)`` pins for the current accelerator, which is ``mncore`` once it is
    registered. Its device buffers are host memory, so there is nothing to pin: skip pinning for it, as
    DataLoader itself does for MPS (without this, PyTorch fails asking for a C++ pinned allocator)."""
    import torch.utils.data._utils.pin_memory as pinning

    pin = pinning.pin_memory

    def pin_memory(data: Any, device: Any = None) -> Any:
        if device is not None and torch.device(device).type == DEVICE_NAME:
            return data
        return pin(data, device)

    pinning.pin_memory = pin_memory


def _direct_upload_method() -> None:
    """``tensor.mncore()``, the seed programs' way to upload a batch: a plain, contiguous host tensor that
    autograd does not track (and no torch function or dispatch mode watching) goes straight to the upload
    (``upload_dense``: the upload kernel's own checks are the ones made here). The generic method builds a
    device object and goes through ``Tensor.to`` and the C++ dispatcher back into Python, about half the
    cost of a small upload; everything else still takes that route."""
    generic = torch.Tensor.mncore
    if getattr(generic, "mn_direct", False):
        return

    def mncore(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> torch.Tensor:
        if (device is None and not kwargs and type(self) is torch.Tensor and self.is_cpu
                and self.layout == torch.strided and self.is_contiguous()
                and not (self.requires_grad and torch.is_grad_enabled())
                and not torch._C._is_torch_function_mode_enabled() and torch._C._len_torch_dispatch_stack() == 0):
            return upload_dense(self)
        return generic(self, device, non_blocking, **kwargs)

    mncore.mn_direct = True  # type: ignore[attr-defined]
    mncore.__doc__ = generic.__doc__
    torch.Tensor.mncore = mncore  # type: ignore[attr-defined]


def register() -> None:
    """Idempotent: rename PrivateUse1, install hooks, device module and factory kernels."""
    global _lib
    if _lib is not None:
        return
    if torch._C._get_privateuse1_backend_name() != DEVICE_NAME:
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            rename=DEVICE_NAME, backend_module=device_module.DeviceModule()
        )
    _direct_upload_method()
    _lib = torch.library.Library("aten", "IMPL")
    for op in FACTORIES:
        name = op._schema.name.split("::")[1]
        if op._schema.overload_name:
            name += "." + op._schema.overload_name
        _lib.impl(name, factory(op), "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    for name in FUSED_ON_CPU:
        _lib.impl(name, _traced_whole(getattr(aten, name).default), "PrivateUse1")
    _lib.impl("_to_copy", upload_kernel, "PrivateUse1")
    _lib.impl("matmul", _matmul, "AutogradPrivateUse1")
    _lib.impl("_thnn_fused_lstm_cell", _fused_lstm_cell, "AutogradPrivateUse1")
    _lib.impl("_thnn_fused_gru_cell", _fused_gru_cell, "AutogradPrivateUse1")
    _lib.impl("gru.input", _gru, "AutogradPrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from, "PrivateUse1")
    _lib.impl("_efficientzerotensor", _efficient_zeros, "PrivateUse1")
    _lib.impl("tensor_split.tensor_indices_or_sections", _tensor_split, "AutogradPrivateUse1")
    global _fallback_lib
    _fallback_lib = torch.library.Library("_", "IMPL")
    autocast.register(_lib, _fallback_lib)
    _no_pinning_for_mncore()
    device_module.register_loading()
    conversion.install()
    # Let torch.optim pick its foreach (multi-tensor) path for mncore tensors, as it does for CUDA:
    # one traced op per update step instead of one per parameter.
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as foreach_utils

    for allow in (optimizer_mod._foreach_supported_types, foreach_utils._foreach_supported_types):
        if LazyTensor not in allow:
            allow.append(LazyTensor)
