"""The ``full`` tier through pytest: every catalog model (and every hand-written zoo config) on every
backend of ``harness run --tier full``, one test per (model, config, backend), through the same runner
and the same ``ci/expected/full_<backend>.csv`` expectations.

Run with ``pytest -n auto -m full`` (xdist spreads the cells); not part of ``make test``.
"""
from __future__ import annotations

import pytest

from harness import expectations, tiers

pytestmark = pytest.mark.full
CELLS = [(m, c, b) for b in tiers.available_backends() for m, c in tiers.full_tier()]


@pytest.mark.parametrize("model,config,backend", CELLS, ids=lambda x: str(x))
def test_full_tier(model, config, backend, tmp_path):
    row = tiers.run_models([(model, config)], [backend], steps=3, out=tmp_path, fork=True)[0].to_json()
    problems = [p for p in expectations.check([row], "full", backend) if not p.endswith("expected but not run")]
    assert not problems, f"{problems}; row: { {k: v for k, v in row.items() if k != 'traceback'} }"
