"""The ``models`` tier through pytest: the same runner and expectations as ``harness run --tier models``
(lazy, Context and captured lazy mode, each checked against ``ci/expected``).

Run with ``pytest -n auto -m models``; not part of ``make test`` (the default marker expression
deselects it).
"""
from __future__ import annotations

import pytest

from harness import expectations, tiers

pytestmark = pytest.mark.models
BACKEND = "pfvm:cpu"


@pytest.mark.parametrize("model,config", tiers.models_tier(), ids=lambda x: str(x))
def test_models_tier(model, config, tmp_path):
    row = tiers.run_models([(model, config)], [BACKEND], steps=3, out=tmp_path)[0].to_json()
    problems = expectations.check([row], "models", BACKEND)
    problems = [p for p in problems if not p.endswith("expected but not run")]
    assert not problems, f"{problems}; row: { {k: v for k, v in row.items() if k != 'traceback'} }"
    # the captured mode ran beside lazy and Context: its losses cover capture's recordings and the steps after
    if row.get("lazy_captured_status") == "pass":
        assert len(row["lazy_captured_losses"]) == 3 + row["lazy_captured_warmup"] == len(row["eager_losses"])
        assert (row["lazy_captured_replays_per_step"] == 0.0) == bool(row["lazy_captured_reason"]), row
