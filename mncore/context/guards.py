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

from mncore.ir.values import describe_site
from mncore.trace.guards import Guard, evaluate
from mncore.trace.host import as_traced
from mncore.trace.record import value_of
from mncore.trace.sites import user_site


class GuardRecorder:
    """The tracer's ``host_read`` while a Context function compiles: answers each read and records it."""

    def __init__(self, options: tuple) -> None:
        self.options = options
        self.guards: list[Guard] = []

    def __call__(self, t: Any, reason: str) -> torch.Tensor:
        ref, meta = value_of(t), t.mn_meta
        buf = as_traced(evaluate(ref, meta, self.options), meta)
        self.guards.append(Guard(ref, meta, buf.to("cpu", copy=True), reason, describe_site(user_site())))
        return buf
