"""Host reads of pending values answered without cutting the graph, and kept as guards.

A value a traced function reads on the host (``bool(mask.all())``, ``.item()``: transformers'
attention-mask checks) decides which Python branch was traced. Where the trace must stay one graph
(a Context function compiling, a step ``mncore.capture`` records), the value is computed by a graph
of its own on the same device and handed to the function; the traced graph computes it again as an
extra output, and every later run checks that output against the value the branch was traced for
(bit for bit), so an old branch is never replayed silently.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mncore.execute import Job, executor
from mncore.ir.meta import TensorMeta
from mncore.ir.values import Data, Node
from mncore.trace.sync import graph_for


@dataclass(eq=False)
class Guard:
    """One host read: the traced value, what it was when traced, and who read it where."""

    ref: tuple
    meta: TensorMeta
    expected: torch.Tensor
    read: str
    site: str

    def describe(self) -> str:
        return f"the value read by {self.read} at {self.site}"

    def holds(self, value: torch.Tensor) -> bool:
        """Bit-identical to the value when traced (the traced branch depends on exactly it); NaN equals NaN."""
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


def evaluate(ref: tuple, meta: TensorMeta, options: tuple) -> torch.Tensor:
    """The value of ``ref`` now: a graph computing only it, run on the values it reads (what is pending
    elsewhere stays pending)."""
    if type(ref[0]) is not Node:
        return ref[0].wait()
    exe, leaves, scalars = graph_for([ref], options=options)
    out = Data(meta)
    executor.submit(Job(exe=exe, leaves=leaves, scalars=[s.value for s in scalars], outs=[out]))
    return out.wait()


def value_text(t: torch.Tensor) -> str:
    """A read value in a message: the number itself, or the tensor's shape and dtype."""
    return repr(t.item()) if t.numel() == 1 else f"a {list(t.shape)} {str(t.dtype).replace('torch.', '')} tensor"
