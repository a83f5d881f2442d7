"""Registered tensors a Context function replaces instead of updating in place.

Some models keep running statistics by rebinding a buffer (``self.x_min = self.x_min + m``, as
transformers' I-BERT does) rather than writing into it. While tracing, the module's slot then holds a
tensor of the trace, and the registered tensor never sees the new value. ``RebindWatch`` notices each
such assignment through PyTorch's module registration hooks; after the function returns, the last value
assigned is copied into the registered tensor (so it becomes an ordinary state update of the compiled
step) and the registered tensor goes back into its slot, where the user's module expects it.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.nn.modules import module as nn_module

from mncore.errors import NotCompilableError


class RebindWatch:
    """Records module buffer and parameter slots that held a watched tensor and were assigned another.

    ``watched`` maps ``id`` of each object the slots hold (the registered tensors) to its registered name.
    """

    def __init__(self, watched: dict[int, str]):
        self.watched = watched
        self._slots: dict[tuple[int, str, str], tuple[dict, str, torch.Tensor]] = {}
        self._handles: list[Any] = []

    def start(self) -> None:
        self._handles = [nn_module.register_module_buffer_registration_hook(self._hook("_buffers")),
                         nn_module.register_module_parameter_registration_hook(self._hook("_parameters"))]

    def _hook(self, kind: str) -> Callable[[torch.nn.Module, str, Any], None]:
        def hook(module: torch.nn.Module, name: str, value: Any) -> None:
            slots = module.__dict__.get(kind)
            if slots is None:
                return
            key = (id(module), kind, name)
            old = slots.get(name)
            if key not in self._slots and old is not None and old is not value and id(old) in self.watched:
                self._slots[key] = (slots, name, old)
        return hook

    def apply(self) -> None:
        """Copy each replaced tensor's last value into the registered tensor (under ``no_grad``, like an
        optimizer's update); a value of another shape or dtype cannot become a state update."""
        with torch.no_grad():
            for slots, name, old in self._slots.values():
                new = slots.get(name)
                registered = self.watched[id(old)]
                if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype:
                    what = (f"a {type(new).__name__}" if not isinstance(new, torch.Tensor)
                            else f"a {new.dtype} tensor of shape {list(new.shape)}")
                    raise NotCompilableError(
                        f"the function replaces the registered tensor {registered!r} ({old.dtype}, shape "
                        f"{list(old.shape)}) with {what} (module attribute {name!r}); a compiled step keeps each "
                        "registered tensor's shape and dtype. Keep them, or run this model in lazy mode")
                if new is not old:
                    old.copy_(new)

    def stop(self) -> None:
        """Remove the hooks and put every registered tensor back into the slot it was replaced in."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for slots, name, old in self._slots.values():
            slots[name] = old
        self._slots.clear()
