"""Op unit tests generated from the shape registry (tier ``unit``).

Every registry row is checked: inputs are regenerated from the row's metadata, the op runs lazily on
mncore (pfvm:cpu) and eagerly on CPU, and the shared comparison function judges them
(``harness.optests.check``). Rows of one op share a test item (``MNCORE_OPTEST_BATCH`` rows; a failing
item lists each failing row with why); rows with an expected failure are items of their own, strict
xfail. ``MNCORE_OPTEST_SAMPLE=N`` runs a deterministic sample of N rows (every op keeps at least one
row); the default is the full set.
"""
from __future__ import annotations

import pytest

import mncore
from harness import expected, optests
from harness.opgen import describe

pytestmark = pytest.mark.unit
DEVICE = "pfvm:cpu"
ROWS = optests.rows(mncore.config.get("optest_sample"))
EXPECTED = [x for x in expected.load() if x.suite == "registry"]


def _marks(row) -> list:
    dtypes = {t["dtype"] for t in row.tensors()}
    return [pytest.mark.xfail(strict=True, reason=f"[{x.category}] {x.reason}")
            for x in EXPECTED if x.matches(row.op, dtypes, DEVICE)]


def _params():
    marked = {id(r): m for r in ROWS if (m := _marks(r))}
    for r in ROWS:
        if id(r) in marked:
            yield pytest.param([r], id=describe(r), marks=marked[id(r)])
    plain = [r for r in ROWS if id(r) not in marked]
    items = optests.batches(plain, mncore.config.get("optest_batch"))
    # the costliest items first: `pytest -n auto` hands items out in this order, so no worker is left
    # with a large one while the others are idle at the end
    for name, rows in sorted(items, key=lambda item: -sum(map(optests.elements, item[1]))):
        yield pytest.param(rows, id=name)


@pytest.mark.parametrize("rows", list(_params()))
def test_registry_op(rows):
    mncore.init_cpu(implicit_sync="silent")
    failures = [(r, why) for r in rows if (why := optests.check(r))]
    assert not failures, optests.describe_failures(failures, len(rows))  # outputs, and the arguments ops write


def test_expected_failures_match_registry_rows():
    """Every expected-failure entry must still match a registry row (stale entries are reported here)."""
    rows = optests.rows()
    stale = [x for x in EXPECTED
             if not any(x.matches(r.op, {t["dtype"] for t in r.tensors()}, DEVICE) for r in rows)]
    assert not stale, "stale entries in ci/expected_op_failures.json: " + "; ".join(f"{x.op} ({x.dtype})" for x in stale)
