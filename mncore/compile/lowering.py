"""Which kernel runs each traced aten op on the pfvm devices, and how users override it.

Most ops run as themselves. A few are exact for the tracer's logical values but fail on real
strided buffers or CPU kernels, so they get a substitute. ``register_lowering`` lets a user (or a
test backend) replace the kernel of any op; the override takes part in the graph key through the
lowering version, so executables compiled before an override are never reused after it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from mncore.compile import value_checks
from mncore.ir.ops import LAZY_BIT_VIEWS, named_args
from mncore.ir.targets import MutateFn

aten = torch.ops.aten


def _histc_any_dtype(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """CPU's histc has no integer kernel (CUDA's does): count in float64, return the input's dtype. No kernel
    takes bool: that raises eager's own error."""
    if x.is_floating_point() or x.dtype == torch.bool:
        return aten.histc.default(x, bins, min, max)
    return aten.histc.default(x.double(), bins, min, max).to(x.dtype)


def _pdist_backward_of_no_rows(grad: torch.Tensor, x: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """CPU's ``_pdist_backward`` divides by zero on an input with no rows but some columns (SIGFPE: the
    process dies, eager's too); the gradient of no rows is empty. The kernel still runs on two rows of
    the same dtype first, so that it refuses what it refuses for any input (bfloat16, half)."""
    if x.size(0) == 0:
        aten._pdist_backward.default(grad.new_ones(1), x.new_zeros(2, 1), p, pdist.new_ones(1))
        return torch.zeros_like(x)
    return aten._pdist_backward.default(grad, x, p, pdist)


def _margin_loss_of_no_rows(op: Any) -> Callable:
    """CPU's ``multi_margin_loss`` and ``multilabel_margin_loss_forward`` leave the reduced loss of an empty
    batch unwritten (eager returns whatever the allocation held, and two runs differ). Give it the value
    PyTorch's other losses give: NaN for the mean of nothing, 0 for the sum."""
    def run(*args: Any, **kwargs: Any) -> Any:
        res = op(*args, **kwargs)
        loss = res[0] if isinstance(res, tuple) else res
        a = named_args(op, args, kwargs)
        if a["self"].numel() == 0 and a["reduction"] != 0:  # 1: mean, 2: sum
            loss.fill_(float("nan") if a["reduction"] == 1 else 0.0)
        return res

    run.__name__ = f"{op._schema.name.split('::')[-1]}_of_no_rows"
    return run


def _batch_norm_backward_of_nothing(op: Any) -> Callable:
    """CPU's batch-norm backward kernels divide by the batch size and by the channel count, so an input with
    no batch or no channels kills the process (SIGFPE, eager's too; found by fuzzing). Its gradients are
    sums over nothing: an empty input gradient, zero weight and bias gradients. The kernel still runs on
    one value of the same dtypes first, so that it refuses what it refuses for any input and says which
    gradients exist. Used as the op's shape rule too (its meta rule divides by zero there)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        x = named_args(op, args, kwargs)["input"]
        if x.dim() < 2 or (x.size(0) and x.size(1)):
            return op(*args, **kwargs)
        one = (1,) * x.dim()

        def stand_in(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            size = one if v.dim() == x.dim() else (1,) if v.numel() or v.size(0) == x.size(1) else (0,)
            return torch.ones(size, dtype=v.dtype)

        grads = op(*[stand_in(v) for v in args], **{k: stand_in(v) for k, v in kwargs.items()})
        shapes = (x.shape, (x.size(1),), (x.size(1),))
        return tuple(None if g is None else torch.zeros(shape, dtype=g.dtype, device=x.device)
                     for g, shape in zip(grads, shapes))

    run.__name__ = f"{op._schema.name.split('::')[-1]}_of_nothing"
    return run


# the kernels above, one per batch-norm backward op: also those ops' shape rules (``trace/infer.py``)
BATCH_NORM_BACKWARD_OF_NOTHING = {op: _batch_norm_backward_of_nothing(op) for op in (
    aten.native_batch_norm_backward.default, aten.batch_norm_backward.default)}


def _aligned_if_empty(m: torch.Tensor) -> torch.Tensor:
    """An empty ``_grouped_mm`` operand with strides its kernel accepts (rows 16-byte aligned). A device buffer is
    a dense copy, and a dense empty matrix has rows of one element, which the kernel refuses where the user's
    operand (a transposed view, found by fuzzing) passed; an empty operand holds no values, so any strides do."""
    if m.numel() or m.dim() < 2:
        return m
    rows, cols = m.shape[-2:]
    align = max(16 // m.element_size(), 1)
    lead = -(-max(cols, 1) // align) * align
    return torch.empty_strided(m.shape, (rows * lead, lead, 1)[-m.dim():], dtype=m.dtype, device=m.device)


def _grouped_mm_covered(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: torch.Tensor | None = None, bias: Any = None,
                        out_dtype: Any = None) -> torch.Tensor:
    """CPU's ``_grouped_mm`` writes only what its groups cover and leaves the rest as the allocation held it
    (eager's too: up to 3e29 found by fuzzing), and its backward is made of ``_grouped_mm`` calls. The rest
    are sums over nothing: zero. With a 2-D ``mat_a`` and a 3-D ``mat_b`` that is the rows past the last
    offset, with 3-D and 2-D the columns past it, with both 2-D the groups whose share of the inner
    dimension is empty."""
    out = aten._grouped_mm.default(_aligned_if_empty(mat_a), _aligned_if_empty(mat_b), offs, bias, out_dtype)
    if offs is None:
        return out
    ends = offs.tolist()
    last = ends[-1] if ends else 0
    dims = (mat_a.dim(), mat_b.dim())
    if dims == (2, 3):
        out[last:] = 0
    elif dims == (3, 2):
        out[..., last:] = 0
    elif dims == (2, 2):
        for group, (start, end) in enumerate(zip([0, *ends], ends)):
            if end <= start:
                out[group] = 0
    return out


def _on_dense_copies(op: Any) -> Callable:
    """CPU's fused optimizer kernels (``_fused_adam_``, ...) index every tensor as if it were contiguous,
    so a transposed parameter or a strided gradient is updated with the wrong elements (eager's too).
    Run them on dense copies and write what the op writes back through the original strides."""
    written = {a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    positions = [a.name for a in op._schema.arguments]

    def run(*args: Any, **kwargs: Any) -> Any:
        back: list[tuple[torch.Tensor, torch.Tensor]] = []

        def dense(x: Any, write: bool) -> Any:
            if isinstance(x, (list, tuple)):
                return type(x)(dense(a, write) for a in x)
            if isinstance(x, torch.Tensor) and not x.is_contiguous():
                copy = x.contiguous()
                if write:
                    back.append((x, copy))
                return copy
            return x

        res = op(*[dense(a, name in written) for a, name in zip(args, positions)],
                 **{k: dense(v, k in written) for k, v in kwargs.items()})
        for original, copy in back:
            original.copy_(copy)
        return res

    run.__name__ = f"{op._schema.name.split('::')[-1]}_on_dense_copies"
    return run


_FUSED_OPTIMIZERS = [getattr(getattr(aten, name), overload)
                     for name in ("_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_",
                                  "_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad")
                     for overload in ("default", "tensor_lr") if hasattr(getattr(aten, name), overload)]

def _standing_in(op: Any, fn: Callable) -> Callable:
    """``fn`` marked as the kernel of ``op`` (``fn.op``, as on the tracer's own wrappers): fusion classes and
    costs it as that op, the emulated board rounds its operands as that op's, and an error names the op."""
    if not isinstance(fn, torch._ops.OpOverload):
        fn.op = op
    return fn


_BUILTIN: dict[Any, Callable] = {op: _standing_in(op, fn) for op, fn in {
    aten.view.default: aten.reshape.default,
    aten._unsafe_view.default: aten.reshape.default,
    aten.histc.default: _histc_any_dtype,
    aten._grouped_mm.default: _grouped_mm_covered,
    aten._pdist_backward.default: _pdist_backward_of_no_rows,
    **BATCH_NORM_BACKWARD_OF_NOTHING,
    aten.multi_margin_loss.default: _margin_loss_of_no_rows(aten.multi_margin_loss.default),
    aten.multilabel_margin_loss_forward.default: _margin_loss_of_no_rows(aten.multilabel_margin_loss_forward.default),
    **LAZY_BIT_VIEWS,
    **value_checks.SUBSTITUTES,
    **{op: _on_dense_copies(op) for op in _FUSED_OPTIMIZERS},
}.items()}
_overrides: dict[Any, Callable] = {}
_version = [0]


def lower(target: Any) -> Any:
    """The callable that executes ``target`` (an override, a built-in substitute, or itself). A mutating op
    without a functional twin is traced as a ``MutateFn`` around it: an override of the op replaces the
    kernel inside, so it applies there too."""
    if isinstance(target, MutateFn):
        fn = _overrides.get(target.op) or _builtin(target.op)
        return target if fn is None else target.with_op(fn)
    return _overrides.get(target) or _builtin(target) or target


def _builtin(op: Any) -> Callable | None:
    """The built-in substitute of ``op``; those of other libraries' ops are made on first use."""
    fn = _BUILTIN.get(op)
    if fn is None and isinstance(op, torch._ops.OpOverload) and (make := value_checks.BY_NAME.get(op._schema.name)):
        fn = _BUILTIN[op] = _standing_in(op, make(op))
    return fn


def register_lowering(target: Any, fn: Callable) -> None:
    """Run ``fn`` instead of the aten overload ``target`` in graphs compiled from now on (and where lazy mode
    runs ``target`` eagerly, e.g. ops whose output shape depends on values)."""
    if not isinstance(target, torch._ops.OpOverload):
        raise TypeError(f"register_lowering needs an aten op overload such as torch.ops.aten.mul.Tensor, got {target!r}")
    if not callable(fn):
        raise TypeError(f"register_lowering: {fn!r} is not callable")
    def override(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    # torch.fx names every call target in its generated code; lambdas have no usable name.
    override.__name__ = override.__qualname__ = f"override_{str(target).replace('.', '_')}"
    _overrides[target] = override
    _version[0] += 1


def unregister_lowering(target: Any) -> None:
    """Drop an override registered with ``register_lowering`` (no error if there is none)."""
    if _overrides.pop(target, None) is not None:
        _version[0] += 1


def has_overrides() -> bool:
    """Graphs compiled under user overrides are never written to or read from the disk cache."""
    return bool(_overrides)


def version() -> int:
    """Changes whenever the set of overrides changes; part of every graph key."""
    return _version[0]
