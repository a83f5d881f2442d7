"""Case generation: pick a registry row, apply 0-3 random mutations, all from a per-case seed.

Case ``i`` of seed ``S`` depends only on (S, i, the selected rows, ``max_numel``), never on what
earlier cases did, so a campaign with the same seed and case budget runs the same cases whatever
the timing (a ``--seconds`` budget only changes how many of them run).
"""
from __future__ import annotations

import fnmatch
import math
import random
import re
from typing import Callable

from harness.fuzz.cases import Case, tensor_specs
from shape_registry.format import Entry

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")
INT_DTYPES = ("int64", "int32")
# Relative weights of the mutation kinds the generator draws.
WEIGHTS: dict[str, int] = {
    "resize_pm1": 16, "resize_x2": 6, "resize_0": 6, "resize_1": 7, "broadcast": 8,
    "dtype": 12, "layout": 12, "values": 13, "nonfinite": 6, "invalid": 9,
}
MUTATIONS_PER_CASE = (0, 1, 1, 2, 2, 3)


def select_ops(ops: list[str], pattern: str | None) -> list[str]:
    """Ops matching ``pattern``: comma-separated globs (``aten.add*``) or regexes (anything with ``^$()|+\\``)."""
    if not pattern:
        return sorted(ops)
    out = set()
    for p in (x.strip() for x in pattern.split(",") if x.strip()):
        if re.search(r"[\^$()|+\\{}]", p):
            rx = re.compile(p)
            out |= {o for o in ops if rx.search(o)}
        else:
            out |= {o for o in ops if fnmatch.fnmatchcase(o, p)}
    return sorted(out)


def seed_rows(rows: list[Entry], pattern: str | None, max_numel: int,
              skip: Callable[[Entry], bool] = lambda e: False) -> dict[str, list[Entry]]:
    """Rows per selected op, keeping those within ``max_numel`` input elements (else the op's smallest)."""
    by_op: dict[str, list[Entry]] = {}
    for r in rows:
        if not skip(r):
            by_op.setdefault(r.op, []).append(r)
    chosen = select_ops(list(by_op), pattern)
    out = {}
    for op in chosen:
        sized = sorted(by_op[op], key=lambda e: (_numel(e), e.key))
        small = [e for e in sized if _numel(e) <= max_numel]
        out[op] = small or sized[:1]
    return out


def _numel(e: Entry) -> int:
    return sum(math.prod(t["shape"]) for t in e.tensors())


def generate(rows: dict[str, list[Entry]], seed: int, index: int, max_numel: int) -> Case:
    """Case ``index`` of the campaign with ``seed``: op uniformly, then a row, then mutations."""
    rng = random.Random(f"mncore-fuzz:{seed}:{index}")
    op = rng.choice(sorted(rows))
    case = Case.from_entry(rng.choice(rows[op]), value_seed=rng.randrange(2**31), index=index)
    kinds, weights = zip(*WEIGHTS.items())
    for _ in range(rng.choice(MUTATIONS_PER_CASE)):
        for _attempt in range(6):
            m = MUTATORS[rng.choices(kinds, weights)[0]](case, rng)
            if m is None:
                continue
            cand = case.with_mutation(dict(m, by="fuzz"))
            if cand.numel() <= max(max_numel, case.numel()):
                case = cand
                break
    return case


# -- mutators: each returns a mutation record for the case, or None when it does not apply ------
def _specs(case: Case, pred: Callable[[dict], bool] = lambda s: True) -> list[tuple[str, dict]]:
    e = case.entry()
    return [(p, s) for p, s in tensor_specs(e.args, e.kwargs) if pred(s)]


def _dim(case: Case, rng: random.Random, pred: Callable[[int], bool]) -> tuple[str, int, int] | None:
    picks = [(p, d, n) for p, s in _specs(case) for d, n in enumerate(s["shape"]) if pred(n)]
    return rng.choice(picks) if picks else None


def _resize_pm1(case: Case, rng: random.Random) -> dict | None:
    pick = _dim(case, rng, lambda n: True)
    if pick is None:
        return None
    p, d, n = pick
    to = n + 1 if n == 0 or rng.random() < 0.5 else n - 1
    if rng.random() < 0.85:
        return {"kind": "resize", "from": n, "to": to}
    return {"kind": "resize", "arg": p, "dim": d, "to": to}


def _resize_to(fn: Callable[[int], int], pred: Callable[[int], bool]) -> Callable[[Case, random.Random], dict | None]:
    def mutate(case: Case, rng: random.Random) -> dict | None:
        pick = _dim(case, rng, pred)
        return None if pick is None else {"kind": "resize", "from": pick[2], "to": fn(pick[2])}
    return mutate


def _broadcast(case: Case, rng: random.Random) -> dict | None:
    pick = _dim(case, rng, lambda n: n > 1)
    return None if pick is None else {"kind": "resize", "arg": pick[0], "dim": pick[1], "to": 1}


def _dtype(case: Case, rng: random.Random) -> dict | None:
    specs = _specs(case, lambda s: s["dtype"] in FLOAT_DTYPES + INT_DTYPES)
    if not specs:
        return None
    p, s = rng.choice(specs)
    pool = FLOAT_DTYPES if s["dtype"] in FLOAT_DTYPES else INT_DTYPES
    to = rng.choice([d for d in pool if d != s["dtype"]])
    if rng.random() < 0.85:
        return {"kind": "dtype", "from": s["dtype"], "to": to}
    return {"kind": "dtype", "arg": p, "to": to}


def _layout(case: Case, rng: random.Random) -> dict | None:
    if case.op.startswith("aten.as_strided"):
        # as_strided reads the storage behind the view, and a device copy of a non-dense tensor is
        # dense (on CUDA as on mncore): eager CPU on the gappy original is no reference for that.
        return None
    specs = _specs(case, lambda s: len(s["shape"]) >= 1 and math.prod(s["shape"]) > 1 and "layout" not in s)
    if not specs:
        return None
    p, s = rng.choice(specs)
    layout = "transposed" if len(s["shape"]) >= 2 and rng.random() < 0.5 else "strided"
    return {"kind": "layout", "arg": p, "layout": layout}


def _values(dists: tuple[str, ...]) -> Callable[[Case, random.Random], dict | None]:
    def mutate(case: Case, rng: random.Random) -> dict | None:
        specs = _specs(case, lambda s: s["dtype"] in FLOAT_DTYPES and math.prod(s["shape"]) > 0)
        if not specs:
            return None
        return {"kind": "values", "arg": rng.choice(specs)[0], "dist": rng.choice(dists)}
    return mutate


def _invalid(case: Case, rng: random.Random) -> dict | None:
    """Inputs eager usually rejects: out-of-range indices, a lone mismatched dim, bool where floats go."""
    index_specs = _specs(case, lambda s: "indexes" in s and math.prod(s["shape"]) > 0)
    choice = rng.random()
    if index_specs and choice < 0.5:
        return {"kind": "index_oob", "arg": rng.choice(index_specs)[0]}
    if choice < 0.8:
        pick = _dim(case, rng, lambda n: n > 1)
        return None if pick is None else {"kind": "resize", "arg": pick[0], "dim": pick[1], "to": pick[2] + 1}
    floats = _specs(case, lambda s: s["dtype"] in FLOAT_DTYPES)
    return {"kind": "dtype", "arg": rng.choice(floats)[0], "to": "bool"} if floats else None


MUTATORS: dict[str, Callable[[Case, random.Random], dict | None]] = {
    "resize_pm1": _resize_pm1,
    "resize_x2": _resize_to(lambda n: 2 * n, lambda n: n >= 1),
    "resize_0": _resize_to(lambda n: 0, lambda n: n >= 1),
    "resize_1": _resize_to(lambda n: 1, lambda n: n > 1),
    "broadcast": _broadcast,
    "dtype": _dtype,
    "layout": _layout,
    "values": _values(("large", "negative", "denormal")),
    "nonfinite": _values(("nan", "inf")),
    "invalid": _invalid,
}
