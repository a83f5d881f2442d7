"""Which kernel runs each traced aten op on the pfvm devices, and how users override it.

Most ops run as themselves. A few are exact for the tracer's logical values but fail on real
strided buffers or CPU kernels, so they get a substitute. ``register_lowering`` lets a user (or a
test backend) replace the kernel of any op; the override takes part in the graph key through the
lowering version, so executables compiled before an override are never reused after it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from mncore.ir.ops import LAZY_BIT_VIEWS
from mncore.ir.targets import MutateFn

aten = torch.ops.aten


def _histc_any_dtype(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """CPU's histc has no integer kernel (CUDA's does): count in float64, return the input's dtype."""
    if x.is_floating_point():
        return aten.histc.default(x, bins, min, max)
    return aten.histc.default(x.double(), bins, min, max).to(x.dtype)


def _pdist_backward_of_no_rows(grad: torch.Tensor, x: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """CPU's ``_pdist_backward`` divides by zero on an input with no rows but some columns (SIGFPE: the
    process dies, eager's too); the gradient of no rows is empty."""
    if x.size(0) == 0:
        return torch.zeros_like(x)
    return aten._pdist_backward.default(grad, x, p, pdist)


_BUILTIN: dict[Any, Callable] = {
    aten.view.default: aten.reshape.default,
    aten._unsafe_view.default: aten.reshape.default,
    aten.histc.default: _histc_any_dtype,
    aten._pdist_backward.default: _pdist_backward_of_no_rows,
    **LAZY_BIT_VIEWS,
}
_overrides: dict[Any, Callable] = {}
_version = [0]


def lower(target: Any) -> Any:
    """The callable that executes ``target`` (an override, a built-in substitute, or itself). A mutating op
    without a functional twin is traced as a ``MutateFn`` around it: an override of the op replaces the
    kernel inside, so it applies there too."""
    if isinstance(target, MutateFn):
        fn = _overrides.get(target.op)
        return target if fn is None else target.with_op(fn)
    return _overrides.get(target) or _BUILTIN.get(target, target)


def register_lowering(target: Any, fn: Callable) -> None:
    """Run ``fn`` instead of the aten overload ``target`` in graphs compiled from now on."""
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
