"""Binding registered host tensors to their lazy twins while a Context function traces, and back.

A tensor is swapped in place (``torch.utils.swap_tensors``) when it can be: then every reference to
it, anywhere, sees the twin. ``swap_tensors`` refuses a tensor that has weak references (``nn.LSTM``
and ``nn.GRU`` keep them to their weights), so such a tensor is substituted instead, as
``torch.func.functional_call`` substitutes parameters: every list and dict that holds it (a module's
parameter dict, an RNN's flat weights, an optimizer's parameter groups, and the optimizer state's
keys) holds the twin while tracing and the host tensor again afterwards.
"""
from __future__ import annotations

import gc
import weakref
from typing import Callable

import torch


class Binder:
    """Binds host tensors to twins; ``restore`` undoes every binding (in reverse order)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    @staticmethod
    def swappable(host: torch.Tensor) -> bool:
        return not weakref.getweakrefcount(host)

    def swap(self, host: torch.Tensor, twin: torch.Tensor) -> None:
        torch.utils.swap_tensors(host, twin)
        self._undo.append(lambda: torch.utils.swap_tensors(host, twin))

    def substitute(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], keep: tuple = ()) -> None:
        """Replace each host by its twin in every list and dict that refers to it, except ``keep``
        (the containers that must go on naming the host tensor, such as the Context's registry)."""
        twin_of = {id(h): t for h, t in pairs}
        kept = {id(c) for c in keep}
        for holder in gc.get_referrers(*(h for h, _ in pairs)):
            if id(holder) in kept:
                continue
            if type(holder) is list:
                for i, item in enumerate(holder):
                    if id(item) in twin_of:
                        self._set(holder, i, twin_of[id(item)])
            elif isinstance(holder, dict):
                for key, value in list(holder.items()):
                    if id(key) in twin_of:
                        self._rekey(holder, key, twin_of[id(key)])
                        key = twin_of[id(key)]
                    if id(value) in twin_of:
                        self._set(holder, key, twin_of[id(value)])

    def _set(self, holder: list | dict, key: object, new: object) -> None:
        old = holder[key]
        holder[key] = new
        self._undo.append(lambda: holder.__setitem__(key, old))

    def _rekey(self, holder: dict, old: object, new: object) -> None:
        holder[new] = holder.pop(old)
        self._undo.append(lambda: holder.__setitem__(old, holder.pop(new)))

    def restore(self) -> list[str]:
        """Undo every binding; returns the errors (each binding is undone even when one fails)."""
        errors = []
        while self._undo:
            try:
                self._undo.pop()()
            except Exception as e:  # noqa: BLE001 - restore the rest, then report
                errors.append(str(e))
        return errors
