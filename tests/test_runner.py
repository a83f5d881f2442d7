"""The tier runner itself: injected faults, crash isolation, expectation checks, result files."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import mncore
from harness import cells, runner, tiers
from harness.results import write_results
from reports.schema import ModelRow

pytestmark = pytest.mark.unit


def test_broken_backend_op_gives_fail_accuracy_with_repro():
    """Inject a wrong lowering for relu (run as "x * 1.5": wrong values, same shape/dtype): fail_accuracy."""
    relu = torch.ops.aten.relu.default
    mncore.register_lowering(relu, lambda x: x * 1.5)
    try:
        row = runner.run_one("mlp_w64", "tiny", "pfvm:cpu", steps=2)
    finally:
        mncore.unregister_lowering(relu)
    assert row.status == "fail_accuracy", row
    assert "lazy vs eager" in row.reason
    assert row.repro.startswith("python -m harness.runner --model mlp_w64")


def test_unknown_backend_and_model_are_skipped_rows():
    assert runner.run_one("mlp_w64", "tiny", "pfvm:tpu", steps=1).status == "skipped"
    row = runner.run_one("no_such_model", "tiny", "pfvm:cpu", steps=1)
    assert row.status == "skipped" and "no_such_model" in row.reason


def _python_that_breaks_mlp_w128(tmp_path, monkeypatch, action: str) -> None:
    """Children run through a wrapper that does ``action`` for mlp_w128 and runs Python for the rest."""
    import sys

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *mlp_w128*) {action} ;; esac\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cells, "PYTHON", str(fake))


def test_crashing_model_is_isolated_and_others_still_report(tmp_path, monkeypatch):
    """A child that dies without writing its row (a segfault-like exit) still yields a row; others pass."""
    _python_that_breaks_mlp_w128(tmp_path, monkeypatch, "kill -SEGV $$")
    rows = tiers.run_models([("mlp_w128", "tiny"), ("mlp_w64", "tiny")], ["pfvm:cpu"], steps=1, out=tmp_path / "r",
                            timeout=300)
    by_model = {r.model: r for r in rows}
    assert by_model["mlp_w128"].status == "fail_to_run"
    assert "-11" in by_model["mlp_w128"].reason and by_model["mlp_w128"].repro
    assert by_model["mlp_w64"].status == "pass"


def test_hung_model_times_out_and_others_still_report(tmp_path, monkeypatch):
    _python_that_breaks_mlp_w128(tmp_path, monkeypatch, "exec sleep 600")
    rows = tiers.run_models([("mlp_w128", "tiny"), ("mlp_w64", "tiny")], ["pfvm:cpu"], steps=1, out=tmp_path / "r",
                            timeout=60, jobs=2)
    by_model = {r.model: r for r in rows}
    assert by_model["mlp_w128"].status == "timeout"
    assert by_model["mlp_w64"].status == "pass"


def test_expected_mismatch_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(tiers, "EXPECTED_DIR", tmp_path)
    good = {"model": "m", "config": "tiny", "backend": "pfvm:cpu", "status": "pass", "graphs_per_step": 1,
            "compiles_after_warmup": 0}
    tiers.write_expected([good], "models", "pfvm:cpu")
    assert tiers.check_expected([good], "models", "pfvm:cpu") == []
    worse = dict(good, status="fail_accuracy")
    assert any("regression" in p for p in tiers.check_expected([worse], "models", "pfvm:cpu"))
    better_exp = dict(good, status="fail_to_run")
    tiers.write_expected([better_exp], "models", "pfvm:cpu")
    assert any("improvement" in p for p in tiers.check_expected([good], "models", "pfvm:cpu"))
    more_graphs = dict(good, graphs_per_step=3)
    tiers.write_expected([good], "models", "pfvm:cpu")
    assert any("graphs_per_step" in p for p in tiers.check_expected([more_graphs], "models", "pfvm:cpu"))


def test_cli_exits_nonzero_on_expected_mismatch(tmp_path, monkeypatch):
    from harness import cli

    monkeypatch.setattr(tiers, "EXPECTED_DIR", tmp_path / "expected")
    fake = [ModelRow(model="mlp_w64", config="tiny", backend="pfvm:cpu", status="pass", graphs_per_step=1,
                     compiles_after_warmup=0, steps=1, time_kind="measured wall time", reason="", repro="")]
    monkeypatch.setattr(tiers, "run_models", lambda *a, **k: fake)
    tiers.write_expected([dict(fake[0].to_json(), graphs_per_step=2)], "models", "pfvm:cpu")
    assert cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny", "--out", str(tmp_path / "r")]) == 1
    tiers.write_expected([fake[0].to_json()], "models", "pfvm:cpu")
    assert cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny", "--out", str(tmp_path / "r2")]) == 0


def test_result_files_round_trip_into_pandas(tmp_path):
    rows = [runner.run_one("mlp_w64", "tiny", "pfvm:cpu", steps=2)]
    jsonl, csv, _ = write_results(rows, tmp_path, tiers.metadata("models", 2), stamp=True)
    back = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert back[0]["model"] == "mlp_w64" and back[0]["status"] == "pass"
    assert back[0]["lazy_losses"] == rows[0].lazy.losses
    df = pd.read_csv(csv)
    assert list(df["model"]) == ["mlp_w64"] and df.loc[0, "status"] == "pass"
    assert {"lazy_step_ms", "context_step_ms", "graphs_per_step", "backend", "time_kind"} <= set(df.columns)
    assert json.loads(df.loc[0, "eager_losses"]) == rows[0].eager_losses


def test_models_tier_covers_every_trait_once():
    import model_zoo

    chosen = tiers.models_tier()
    names = {m for m, _ in chosen}
    assert {"mlp_w64", "resnet18", "gpt2_small"} <= names
    for key in model_zoo.TRAIT_KEYS:
        values = {s.traits[key] for s in model_zoo.all_specs()}
        covered = {model_zoo.get(m).traits[key] for m in names}
        assert values == covered, key


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (dead, waiting for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_timeout_kills_the_whole_process_group(tmp_path, monkeypatch):
    """A hung cell's own children die with it: the runner kills the process group, not just the child."""
    pidfile = tmp_path / "grandchild.pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cells, "PYTHON", str(fake))
    job = cells.Job("hangs", "harness.runner", (), tmp_path / "hangs.json")
    with cells.CellRunner(1, "test", timeout=3) as runner:
        (outcome,) = runner.run([job], lambda o: o, status=lambda o: o.kind)
    assert outcome.kind == "timeout" and "no result after 3s" in outcome.reason
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while _running(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(grandchild)


def test_exit_without_result_is_oom_or_crash():
    assert cells.exit_kind(-9, "") == "oom" and cells.exit_kind(137, "") == "oom"
    assert cells.exit_kind(1, "RuntimeError: CUDA out of memory. Tried to allocate") == "oom"
    assert cells.exit_kind(-11, "Fatal Python error: Segmentation fault") == "crash"
    assert cells.exit_kind(1, "Traceback ...") == "crash"
