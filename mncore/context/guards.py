"""Host reads inside a Context function: evaluated from the sample at compile time, then guarded.

A value the function reads on the host while it is compiled (``bool(mask.any())``, ``.item()``,
``.tolist()``: transformers' attention-mask checks) decides which Python branch was traced. It is
computed from the sample (a graph of its own, on the same device), handed to the function, and kept
as a guard: the compiled graph computes the same value as an extra output, and every call checks it
against the compile-time value. A call whose guard changed is rerun on a variant compiled for the new
value (``CompiledFunction`` keeps a bounded number), so the old branch is never used silently.
"""
from __future__ import annotations

from typing import Any

import torch

from mncore.trace.guards import Guard
from mncore.trace.host import read_as_guard
from mncore.trace.record import value_of


class GuardRecorder:
    """The tracer's ``host_read`` while a Context function compiles: answers each read and records it."""

    def __init__(self, options: tuple) -> None:
        self.options = options
        self.guards: list[Guard] = []

    def __call__(self, t: Any, reason: str) -> torch.Tensor:
        return read_as_guard(t, value_of(t), reason, self.options, self.guards)
