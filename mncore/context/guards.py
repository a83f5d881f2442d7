"""Host reads inside a Context function: evaluated from the sample at compile time, then guarded.

A value the function reads on the host while it is compiled (``bool(mask.any())``, ``.item()``,
``.tolist()``: transformers' attention-mask checks) decides which Python branch was traced. It is
computed from the sample (a graph of its own, on the same device), handed to the function, and kept
as a guard: the compiled graph computes the same value as an extra output, and every call checks it
against the compile-time value. A call whose guard changed is rerun on a variant compiled for the new
value (``CompiledFunction`` keeps a bounded number), so the old branch is never used silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from mncore.execute import Job, executor
from mncore.ir.meta import TensorMeta
from mncore.ir.values import Data, Node, describe_site
from mncore.trace import graph_for
from mncore.trace.host import as_traced
from mncore.trace.record import value_of
from mncore.trace.sites import user_site


@dataclass(eq=False)
class Guard:
    """One host read: the traced value, what it was at compile time, and who read it where."""

    ref: tuple
    meta: TensorMeta
    expected: torch.Tensor
    read: str
    site: str

    def describe(self) -> str:
        return f"the value read by {self.read} at {self.site}"

    def holds(self, value: torch.Tensor) -> bool:
        """Bit-identical to the compile-time value (the traced branch depends on exactly it); NaN equals NaN."""
        value = value.to("cpu", dtype=self.expected.dtype)
        if value.shape != self.expected.shape:
            return False
        same = value == self.expected
        if value.is_floating_point() or value.is_complex():
            same |= value.isnan() & self.expected.isnan()
        return bool(same.all())

    def summary(self) -> dict:
        """For the codegen manifest."""
        return {"read": self.read, "site": self.site, "shape": list(self.expected.shape),
                "dtype": str(self.expected.dtype).replace("torch.", "")}


class GuardRecorder:
    """The tracer's ``host_read`` while a Context function compiles: answers each read and records it."""

    def __init__(self, options: tuple) -> None:
        self.options = options
        self.guards: list[Guard] = []

    def __call__(self, t: Any, reason: str) -> torch.Tensor:
        ref, meta = value_of(t), t.mn_meta
        buf = as_traced(_evaluate(ref, meta, self.options), meta)
        self.guards.append(Guard(ref, meta, buf.to("cpu", copy=True), reason, describe_site(user_site())))
        return buf


def _evaluate(ref: tuple, meta: TensorMeta, options: tuple) -> torch.Tensor:
    """The value of ``ref`` now: a graph computing only it, run on the inputs and registered values."""
    if type(ref[0]) is not Node:
        return ref[0].wait()
    exe, leaves, scalars = graph_for([ref], options=options)
    out = Data(meta)
    executor.submit(Job(exe=exe, leaves=leaves, scalars=[s.value for s in scalars], outs=[out]))
    return out.wait()
