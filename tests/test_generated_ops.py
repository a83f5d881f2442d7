"""Op unit tests generated from the shape registry (tier ``unit``).

Every registry row becomes one test: inputs are regenerated from the row's metadata, the op runs
lazily on mncore (pfvm:cpu) and eagerly on CPU, and the shared comparison function judges them.
``MNCORE_OPTEST_SAMPLE=N`` runs a deterministic sample of N rows (every op keeps at least one row);
the default is the full set.
"""
from __future__ import annotations

import random

import pytest
import torch

import mncore
from harness import expected
from harness.fuzz.oracles import judge, to_cpu
from harness.opgen import clone, describe, make_inputs, resolve_op, to_device
from harness.registry_cmd import DEFAULT_PATH
from shape_registry import Registry

pytestmark = pytest.mark.unit
DEVICE = "pfvm:cpu"


def _rows() -> list:
    rows = Registry.load(DEFAULT_PATH).sorted()
    if not rows:
        raise RuntimeError(f"{DEFAULT_PATH} has no rows: regenerate it with `harness registry record`")
    n = mncore.config.get("optest_sample")
    if n and n < len(rows):
        by_op: dict[str, list] = {}
        for r in rows:
            by_op.setdefault(r.op, []).append(r)
        keep = [rs[0] for rs in by_op.values()]
        rest = [r for r in rows if r not in keep]
        random.Random(0).shuffle(rest)
        rows = sorted(keep + rest[: max(0, n - len(keep))], key=lambda r: r.key)
    return rows


ROWS = _rows()
EXPECTED = [x for x in expected.load() if x.suite == "registry"]


def _params():
    for r in ROWS:
        dtypes = {t["dtype"] for t in r.tensors()}
        marks = [pytest.mark.xfail(strict=True, reason=f"[{x.category}] {x.reason}")
                 for x in EXPECTED if x.matches(r.op, dtypes, DEVICE)]
        yield pytest.param(r, id=describe(r), marks=marks)


@pytest.mark.parametrize("row", list(_params()))
def test_registry_op(row):
    op = resolve_op(row.op)
    args, kwargs = make_inputs(row, seed=0)
    eager_args, eager_kwargs = clone(args), clone(kwargs)
    try:
        want = op(*eager_args, **eager_kwargs)
    except Exception as e:  # the generator must produce inputs eager accepts
        pytest.fail(f"eager PyTorch rejects the regenerated inputs of {row.op}: {type(e).__name__}: {e}")
    mncore.init_cpu(implicit_sync="silent")
    dev_args, dev_kwargs = to_device(clone(args), "mncore"), to_device(clone(kwargs), "mncore")
    got = op(*dev_args, **dev_kwargs)
    mncore.sync()
    verdict = judge(row.op, to_cpu(got), want, to_cpu(dev_args), to_cpu(dev_kwargs), eager_args, eager_kwargs)
    assert verdict, verdict.message  # outputs, and the arguments in-place/out= ops write


def test_expected_failures_match_registry_rows():
    """Every expected-failure entry must still match a registry row (stale entries are reported here)."""
    rows = Registry.load(DEFAULT_PATH).sorted()
    stale = [x for x in EXPECTED
             if not any(x.matches(r.op, {t["dtype"] for t in r.tensors()}, DEVICE) for r in rows)]
    assert not stale, "stale entries in ci/expected_op_failures.json: " + "; ".join(f"{x.op} ({x.dtype})" for x in stale)
