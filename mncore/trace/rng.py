"""Reproducible randomness for traced random ops.

Every random op traced on ``mncore`` takes a fresh 63-bit seed from a counter-based stream
(SplitMix64 of (seed, offset)); the seed is a lifted graph input, never part of the graph key.
``torch.manual_seed(s)`` resets the stream through the device module, so two lazy runs from
the same seed produce identical random numbers. The numbers differ from eager CPU's stream.
"""
from __future__ import annotations

import threading

from mncore.trace.state import tracer

_MASK = (1 << 64) - 1
_state = {"seed": 0, "offset": 0}
_lock = threading.Lock()


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _note_reset() -> None:
    if tracer.recording is not None:
        tracer.recording.refuse("the step sets the random-number state (torch.manual_seed, set_rng_state, fork_rng); "
                                "a replay would draw on from the stream instead")


def manual_seed(seed: int) -> None:
    _note_reset()
    with _lock:
        _state["seed"], _state["offset"] = int(seed) & _MASK, 0


def get_state() -> tuple[int, int]:
    return _state["seed"], _state["offset"]


def set_state(state: tuple[int, int]) -> None:
    _note_reset()
    with _lock:
        _state["seed"], _state["offset"] = int(state[0]), int(state[1])


def next_seed() -> int:
    with _lock:
        off = _state["offset"]
        _state["offset"] = off + 1
        return _splitmix64(_state["seed"] ^ _splitmix64(off)) >> 1
