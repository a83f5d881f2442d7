"""Shrinking: make a failing case smaller while it keeps failing with the *same* signature.

Keeping the signature (op:kind:oracle) is the point: a minimiser that drifts from a mismatch to
an unrelated error "minifies" to the wrong bug (the pain reported on PyTorch's accuracy minifier).
Candidates, tried greedily and restarted after every success: drop one generator mutation, shrink
every dimension of one size to 1 or to half (all tensors together, so related shapes stay
consistent), then a single tensor's dimension (only for cases that already have a lone mismatched
dimension), make one float input's values simple small integers, and last lower a small size by one. A candidate is tried only if no size measure grows and one shrinks (input elements,
generator mutations, non-simple float inputs; ``Case.size_key``).
"""
from __future__ import annotations

import time
from typing import Callable, Iterator

from harness.fuzz.cases import Case, tensor_specs
from harness.fuzz.findings import signature


def _smaller(a: tuple, b: tuple) -> bool:
    return all(x <= y for x, y in zip(a, b)) and a != b


def candidates(case: Case) -> Iterator[Case]:
    for i, m in enumerate(case.mutations):
        if m.get("by", "fuzz") == "fuzz":
            yield case.without(i)
    entry = case.entry()
    specs = list(tensor_specs(entry.args, entry.kwargs))
    sizes = sorted({n for _, s in specs for n in s["shape"] if n > 1}, reverse=True)
    for n in sizes:
        yield case.with_mutation({"kind": "resize", "from": n, "to": 1, "by": "shrink"})
        if n // 2 > 1:
            yield case.with_mutation({"kind": "resize", "from": n, "to": n // 2, "by": "shrink"})
    # One tensor alone only when the failure already involves a lone mismatched dim: on a valid case
    # it would make inputs that eager CPU may not validate (garbage in, garbage "findings" out).
    if any(m["kind"] == "resize" and "arg" in m for m in case.fuzz_mutations()):
        for p, s in specs:
            for d, n in enumerate(s["shape"]):
                if n > 1:
                    yield case.with_mutation({"kind": "resize", "arg": p, "dim": d, "to": n // 2, "by": "shrink"})
    for p, s in specs:
        if s["dtype"].startswith(("float", "bfloat")):
            yield case.with_mutation({"kind": "values", "arg": p, "dist": "simple", "by": "shrink"})
    for n in sizes:  # last, small sizes only: when halving loses the failure (a bug that needs size > k)
        if 2 < n <= 8:
            yield case.with_mutation({"kind": "resize", "from": n, "to": n - 1, "by": "shrink"})


def shrink(case: Case, sig: str, run: Callable[[Case], dict], budget_s: float,
           max_attempts: int = 150) -> tuple[Case, dict]:
    """The smallest case found within the budget that still fails as ``sig``, and a record of the search."""
    t0 = time.monotonic()
    best, attempts, accepted = case, 0, 0
    tried = {case.key()}
    improved = True
    while improved:
        improved = False
        for cand in candidates(best):
            if attempts >= max_attempts or time.monotonic() - t0 > budget_s:
                improved = False
                break
            key = cand.key()
            if key in tried:
                continue
            tried.add(key)
            try:
                if not _smaller(cand.size_key(), best.size_key()):
                    continue
            except Exception:  # noqa: BLE001 - a candidate the mutations cannot express
                continue
            attempts += 1
            if signature(cand.op, run(cand)) == sig:
                best, improved = cand, True
                accepted += 1
                break
    return best, {"attempts": attempts, "accepted": accepted, "seconds": round(time.monotonic() - t0, 2),
                  "size_before": list(case.size_key()), "size_after": list(best.size_key())}
