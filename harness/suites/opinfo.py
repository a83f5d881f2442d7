"""PyTorch's OpInfo database as a suite: every op of ``op_db`` that supports float32 on the CPU, its
first ``cap`` float32 samples (in the database's own order, generated with its fixed seeds), forward
outputs and, for ops that support autograd, input gradients, each against eager CPU
(``harness.suites.check``). An op passes when every sample it ran passes.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from harness.suites.check import Outcome, check, fresh, grad_leaves

DEFAULT_CAP = 8  # samples per op: the first 8 of each op's float32 samples
DTYPE = torch.float32
# Ops returning uninitialised memory (in part, for resize_ growing a tensor): metadata only.
UNINITIALISED = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                           "new_empty_strided", "resize_", "resize_as_"})


def full_name(op: Any) -> str:
    """``name`` or ``name.variant`` (e.g. ``div.floor_rounding``): unique over ``op_db``."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@lru_cache(maxsize=1)
def database() -> dict[str, Any]:
    """The OpInfos that support float32 on the CPU, by full name, in sorted order."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops = {full_name(op): op for op in op_db if DTYPE in op.supported_dtypes("cpu")}
    return dict(sorted(ops.items()))


def sample_unit(names: list[str], every: int) -> list[str]:
    """A deterministic sample: every ``every``-th name in sorted order (the ``-m unit`` subset)."""
    return sorted(names)[::every]


@dataclass
class OpResult:
    """One op (or module) over its samples: ``status`` is pass, fail (a mismatch), error (an exception
    on the backend), eager_fail (no sample eager CPU accepts) or skipped (no samples)."""

    name: str
    status: str
    samples: int = 0
    passed: int = 0
    noise: int = 0
    backward: str = "n/a"
    stage: str = ""
    message: str = ""
    failing_sample: str = ""
    wall_s: float = 0.0

    @property
    def reason(self) -> str:
        if self.status in ("pass", "skipped"):
            return self.message
        return f"sample {self.failing_sample} {self.stage}: {self.message}"


def describe(x: Any) -> str:
    """A short text of a sample's arguments: tensors as dtype(shape), the rest as repr."""
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(describe(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}={describe(v)}" for k, v in x.items()) + "}"
    return repr(x)[:40]


def summarize(name: str, outcomes: list[tuple[str, Outcome]], wall_s: float, backward: bool) -> OpResult:
    """The op's result from its samples' outcomes (the first failing sample gives the reason)."""
    if not outcomes:
        return OpResult(name, "skipped", message="no float32 samples", wall_s=wall_s)
    bad = [(d, o) for d, o in outcomes if not o.ok]
    bw = [o.backward for _, o in outcomes]
    bw_status = "n/a" if not backward else ("fail" if any(o.stage == "backward" for _, o in bad) else
                                            "pass" if "pass" in bw else bw[0])
    res = OpResult(name, "pass", samples=len(outcomes), passed=len(outcomes) - len(bad),
                   noise=sum(o.noise for _, o in outcomes), backward=bw_status, wall_s=wall_s)
    if bad:
        desc, first = bad[0]
        res.status = "error" if first.error else "fail"
        res.stage, res.message, res.failing_sample = first.stage, first.message, desc
    return res


def run_op(name: str, device: str, *, cap: int = DEFAULT_CAP, backward: bool = True) -> OpResult:
    """Check the first ``cap`` float32 samples of OpInfo ``name`` on ``device`` (``mncore`` after init)."""
    op = database()[name]
    t0 = time.perf_counter()
    grad = backward and op.supports_autograd
    torch.manual_seed(0)
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", DTYPE, requires_grad=grad), cap))
    except Exception as e:  # noqa: BLE001 - the database cannot make samples in this torch
        return OpResult(name, "eager_fail", message=f"sample generation raises {type(e).__name__}: {e}"[:300])
    outcomes: list[tuple[str, Outcome]] = []
    for i, s in enumerate(samples):
        desc = f"#{i} {describe([s.input, *s.args])}{describe(s.kwargs) if s.kwargs else ''}"[:200]

        def make(dev: str, double: bool, s: Any = s) -> tuple:
            inp, args, kwargs = fresh((s.input, s.args, s.kwargs), dev, double)
            if kwargs.get("device") is not None and not isinstance(kwargs["device"], torch.device):
                kwargs = dict(kwargs, device=dev)
            return (lambda: op(inp, *args, **kwargs)), grad_leaves((inp, args, kwargs))

        try:
            make("cpu", False)[0]()
        except Exception:  # noqa: BLE001 - a sample eager CPU itself rejects is no test
            continue
        outcomes.append((desc, check(make, device, backward=grad, process=s.output_process_fn_grad,
                                     meta_only=op.name in UNINITIALISED)))
    if samples and not outcomes:
        return OpResult(name, "eager_fail", message="eager CPU rejects every sample")
    return summarize(name, outcomes, time.perf_counter() - t0, grad)
