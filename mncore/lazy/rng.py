"""Reproducible randomness for traced random ops.

Every random op traced on ``mncore`` takes a fresh 63-bit seed from a counter-based stream
(SplitMix64 of (seed, offset)); the seed is a lifted graph input, never part of the graph key.
``torch.manual_seed(s)`` resets the stream through the device module, so two lazy runs from
the same seed produce identical random numbers. The numbers differ from eager CPU's stream.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from mncore.runtime.state import settings

_MASK = (1 << 64) - 1
_state = {"seed": 0, "offset": 0}
_lock = threading.Lock()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def manual_seed(seed: int) -> None:
    with _lock:
        _state["seed"], _state["offset"] = int(seed) & _MASK, 0


def get_state() -> tuple[int, int]:
    return _state["seed"], _state["offset"]


def set_state(state: tuple[int, int]) -> None:
    with _lock:
        _state["seed"], _state["offset"] = int(state[0]), int(state[1])


def next_seed() -> int:
    with _lock:
        off = _state["offset"]
        _state["offset"] = off + 1
        return _splitmix64(_state["seed"] ^ _splitmix64(off)) >> 1


def _native_dropout(g: torch.Generator, x: torch.Tensor, p: float, train: bool | None) -> tuple:
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p >= 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    mask = torch.empty_like(x).bernoulli_(1 - p, generator=g).to(torch.bool)
    return x * mask * (1.0 / (1 - p)), mask


def _like(fill: str):
    def run(g: torch.Generator, x: torch.Tensor, *args: Any, dtype=None, layout=None, device=None,
            pin_memory=None, memory_format=None) -> torch.Tensor:
        out = torch.empty_like(x, dtype=dtype, device=device, memory_format=memory_format or torch.preserve_format)
        if fill == "uniform":
            return out.uniform_(generator=g)
        if fill == "normal":
            return out.normal_(generator=g)
        low, high = (0, args[0]) if len(args) == 1 else (args[0], args[1])
        return out.random_(int(low), int(high), generator=g)
    return run


aten = torch.ops.aten
_CUSTOM = {
    aten.native_dropout.default: _native_dropout,
    aten.rand_like.default: _like("uniform"),
    aten.randn_like.default: _like("normal"),
    aten.randint_like.default: _like("int"),
    aten.randint_like.low_dtype: _like("int"),
}


def supported(op: Any, has_generator: bool) -> bool:
    return has_generator or op in _CUSTOM


class Seeded:
    """Graph target that runs a random op with a generator seeded from a lifted input."""

    def __init__(self, fn: Any, op: Any):
        self.fn = fn
        self.op = op
        self.custom = _CUSTOM.get(op)
        self.__name__ = f"seeded_{getattr(fn, '__name__', str(fn))}"

    def __call__(self, seed: int, *args: Any, **kwargs: Any) -> Any:
        g = torch.Generator(device=settings.exec_device)
        g.manual_seed(int(seed))
        if self.custom is not None:
            return self.custom(g, *args, **kwargs)
        return self.fn(*args, generator=g, **kwargs)

    def __repr__(self) -> str:
        return self.__name__
