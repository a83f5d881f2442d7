"""Module conversion keeps parameter identity on and off the device, without changing CPU programs.

``model.to("mncore")`` must keep each ``Parameter`` object (optimizers and tied weights hold them), and
a ``LazyTensor`` cannot take over a CPU tensor's storage (``param.data = ...``), so PyTorch has to swap
the two Python objects (``torch.utils.swap_tensors``), as it does for traceable wrapper subclasses.
PyTorch's own switch for that, ``torch.__future__.set_swap_module_params_on_conversion``, is global:
with mncore autoloaded at ``import torch`` it changed every CPU program, and a swap refuses tensors with
weak references or extra holders (``load_state_dict`` and ``.double()`` failed on the CPU). Instead,
``Module._apply`` and ``parametrize`` are taught that a conversion to or from mncore swaps, and nothing
else does.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch
import torch.nn.modules.module as module_mod
import torch.nn.utils.parametrize as parametrize_mod

from mncore.trace.tensor import LazyTensor

_leaving = threading.local()  # set while Module._apply converts a module's own mncore parameters


def _swap_predicate(original: Callable[[object], bool]) -> Callable[[object], bool]:
    """PyTorch asks this of the converted tensor (``Module._apply``) or of the destination
    (``parametrize``): swap when it is an mncore tensor, or when the parameters being converted are."""

    def swaps(t: object) -> bool:
        return isinstance(t, LazyTensor) or getattr(_leaving, "active", False) or original(t)

    return swaps


def _scoped_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """Children first, as PyTorch does; then this module's own tensors, swapped when any of its
    parameters lives on mncore (``.cpu()``, ``.double()`` of a model on the device)."""

    def _apply(self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        if recurse:
            for module in self.children():
                module._apply(fn)
        on_device = any(isinstance(p, LazyTensor) for p in self._parameters.values())
        if not on_device or getattr(_leaving, "active", False):
            return original(self, fn, recurse=False)
        _leaving.active = True
        try:
            return original(self, fn, recurse=False)
        finally:
            _leaving.active = False

    _apply.mn_swap = True  # type: ignore[attr-defined]
    _apply.__doc__ = original.__doc__
    return _apply


def install() -> None:
    """Idempotent."""
    if getattr(torch.nn.Module._apply, "mn_swap", False):
        return
    for mod in (module_mod, parametrize_mod):
        mod.is_traceable_wrapper_subclass = _swap_predicate(mod.is_traceable_wrapper_subclass)  # type: ignore[attr-defined]
    torch.nn.Module._apply = _scoped_apply(torch.nn.Module._apply)  # type: ignore[method-assign]
