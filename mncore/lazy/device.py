"""Register ``mncore`` as a real torch device (PrivateUse1 renamed, Python backend)."""
from __future__ import annotations

from typing import Any

import torch

from mncore.lazy import rng
from mncore.lazy.tensor import DEVICE_NAME, LazyTensor, factory

aten = torch.ops.aten

# Factories with no tensor argument reach the PrivateUse1 kernel instead of __torch_dispatch__.
# Composite factories (zeros, ones, full, rand, randn, ...) decompose into these plus in-place ops.
FACTORIES = (
    aten.empty.memory_format, aten.empty_strided.default, aten.arange.default, aten.arange.start,
    aten.arange.start_step, aten.linspace.default, aten.logspace.default, aten.eye.default, aten.eye.m,
    aten.randperm.default, aten.randperm.generator, aten.scalar_tensor.default, aten.full.default,
    aten.zeros.default, aten.ones.default, aten.tril_indices.default, aten.triu_indices.default,
)


class DeviceModule:
    """What ``torch.mncore`` exposes; torch calls ``manual_seed_all`` from ``torch.manual_seed``."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.tensor(list(rng.get_state()), dtype=torch.int64)

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        rng.set_state(tuple(int(v) for v in state.tolist()))

    @staticmethod
    def synchronize(device: Any = None) -> None:
        from mncore.lazy.graph import wait_device_ops

        wait_device_ops()


_lib: Any = None


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


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``copy_`` reaching the backend kernel (Python key excluded, e.g. inside ``torch.tensor``)."""
    LazyTensor.__torch_dispatch__(aten.copy_.default, (), (dst, src), {})
    return dst


def register() -> None:
    """Idempotent: rename PrivateUse1, install hooks, device module and factory kernels."""
    global _lib
    if _lib is not None:
        return
    if torch._C._get_privateuse1_backend_name() != DEVICE_NAME:
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            rename=DEVICE_NAME, backend_module=DeviceModule()
        )
    _lib = torch.library.Library("aten", "IMPL")
    for op in FACTORIES:
        name = op._schema.name.split("::")[1]
        if op._schema.overload_name:
            name += "." + op._schema.overload_name
        _lib.impl(name, factory(op), "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _lib.impl("matmul", _matmul, "AutogradPrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from, "PrivateUse1")
    # Module.to('mncore') must keep parameter identity (optimizers, tied weights): swap, don't copy.
    torch.__future__.set_swap_module_params_on_conversion(True)
    # Let torch.optim pick its foreach (multi-tensor) path for mncore tensors, as it does for CUDA:
    # one traced op per update step instead of one per parameter.
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as foreach_utils

    for allow in (optimizer_mod._foreach_supported_types, foreach_utils._foreach_supported_types):
        if LazyTensor not in allow:
            allow.append(LazyTensor)
