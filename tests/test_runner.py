"""The tier runner itself: injected faults, crash isolation, stale rows, exact counters, expectation
checks and updates, result files."""
from __future__ import annotations

import json
import sysconfig
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import mncore
from harness import cells, expectations, runner, tiers
from harness.results import write_results
from reports import run_summary
from tests.helpers import fake_run_models
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
    # the captured mode replays the same wrong lowering and is judged against eager the same way
    assert row.lazy_captured.status == "fail_accuracy" and row.lazy_captured.reason, row.lazy_captured


def test_captured_mode_failure_keeps_lazy_and_context_results(tmp_path, monkeypatch):
    """A capture that raises: the row says lazy_captured failed (classified as the others are), and the
    lazy and Context results are all there; the row the runner left before the captured mode (what a
    crash there would leave) says the same."""
    out = tmp_path / "row.json"
    left: dict = {}

    def broken_capture(fn):
        def call(*args):
            left.update(json.loads(out.read_text()))
            raise RuntimeError("capture broke")
        return call

    monkeypatch.setattr(mncore, "capture", broken_capture)
    assert runner.main(["--model", "mlp_w64", "--config", "tiny", "--steps", "1", "--out", str(out)]) == 1
    row = ModelRow.from_json(json.loads(out.read_text()), where=str(out))
    assert row.status == "fail_to_run" and row.reason == "lazy_captured: RuntimeError: capture broke", row.reason
    assert row.lazy_captured.status == "fail_to_run" and row.lazy_captured.losses is None
    assert "capture broke" in row.traceback
    assert len(row.lazy.losses) == len(row.context.losses) == 1 and row.lazy_context_ratio is not None
    assert row.captured_context_ratio is None
    assert left["status"] == left["lazy_captured_status"] == "fail_to_run"
    assert left["reason"].startswith("lazy_captured: the process ended while lazy_captured ran")
    assert left["lazy_losses"] == row.lazy.losses and left["context_losses"] == row.context.losses


def test_not_compilable_context_is_its_own_status_with_a_portable_reason(tmp_path, monkeypatch):
    """A step the Context API cannot compile (NotCompilableError) is ``not_compilable``, not a failure: the
    other modes still run and pass, the exit code is 0, and the reason names files without this machine's
    sys.path directories (ci/expected records it)."""
    from mncore.errors import NotCompilableError

    site = Path(sysconfig.get_paths()["purelib"]) / "pkg" / "moe.py"

    def not_compilable(*args):
        raise NotCompilableError(f"mncore: _grouped_mm at {site}:3 in route: its output shape is not known")

    monkeypatch.setattr(runner, "run_context", not_compilable)
    out = tmp_path / "row.json"
    assert runner.main(["--model", "mlp_w64", "--config", "tiny", "--steps", "1", "--out", str(out)]) == 0
    row = ModelRow.from_json(json.loads(out.read_text()), where=str(out))
    assert row.status == "not_compilable", row
    assert row.reason == ("context: NotCompilableError: mncore: _grouped_mm at pkg/moe.py:3 in route: "
                          "its output shape is not known"), row.reason
    assert row.lazy_captured.status == "pass" and len(row.lazy.losses) == 1


def test_not_compilable_is_expected_with_its_reason(tmp_path, monkeypatch):
    """ci/expected keeps a not_compilable row's reason and checks it; other rows' reasons (measured
    numbers) stay out of the file."""
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path)
    base = {"config": "tiny", "backend": "pfvm:cpu", "graphs_per_step": 1, "compiles_after_warmup": 0,
            "lazy_captured_status": "pass", "lazy_captured_replays_per_step": 1.0}
    moe = dict(base, model="moe", status="not_compilable", reason="context: NotCompilableError: _grouped_mm ...")
    drift = dict(base, model="mlp", status="fail_accuracy", reason="lazy vs eager: max abs err 0.31")
    expectations.update([moe, drift], "models", "pfvm:cpu")
    got = expectations.load_expected("models", "pfvm:cpu")
    assert got[("moe", "tiny")]["reason"] == moe["reason"] and got[("mlp", "tiny")]["reason"] == ""
    assert expectations.check([moe, dict(drift, reason="lazy vs eager: max abs err 0.42")], "models", "pfvm:cpu") == []
    found = expectations.check([dict(moe, reason="context: NotCompilableError: nonzero ..."), drift],
                               "models", "pfvm:cpu")
    assert len(found) == 1 and "moe:tiny: reason" in found[0], found


def test_captured_mode_records_why_capture_refused_a_step():
    """A step that reads a value on the host cannot be replayed: capture keeps tracing it (right values)
    and the mode records the CaptureWarning's reason and no replays."""
    import dataclasses

    import model_zoo

    spec = model_zoo.get("mlp_w64")
    reads = dataclasses.replace(spec, loss_fn=lambda model, batch: spec.loss(model, batch) * (
        1.0 + 0.0 * float(batch["x"].sum())))
    plain = runner.run_lazy(reads, "tiny", "pfvm:cpu", steps=6, seed=0)
    res = runner.run_lazy(reads, "tiny", "pfvm:cpu", steps=6, seed=0, capture=True)
    assert res["replays_per_step"] == 0.0 and "on the host" in res["refused"], res["refused"]
    assert res["losses"] == plain["losses"]  # exact on purpose: both trace the same graphs every step


def test_captured_mode_shows_a_step_its_re_validation_refuses():
    """The captured run ends with a re-validation and one more call: a step that replays but changes what
    it computes behind capture's back (here a Python number, changed from the fourth traced call on) is
    refused there, and the call after it is traced, so the replays per step fall below 1."""
    import dataclasses

    import model_zoo

    spec = model_zoo.get("mlp_w64")
    traced = [0]

    def loss(model, batch):
        traced[0] += 1
        return spec.loss(model, batch) * (1.0 if traced[0] <= runner.CAPTURE_WARMUP else 0.5)

    hidden = dataclasses.replace(spec, loss_fn=loss)
    steps = runner.CAPTURE_WARMUP + 2 + runner.CAPTURE_TAIL  # two timed steps
    res = runner.run_lazy(hidden, "tiny", "pfvm:cpu", steps=steps, seed=0, capture=True)
    assert traced[0] == runner.CAPTURE_WARMUP + runner.CAPTURE_TAIL  # the timed steps replayed
    assert res["replays_per_step"] == pytest.approx(2 / 3), res  # the call after the re-validation was traced
    assert "Python number" in res["refused"], res["refused"]


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


def _canned_row(model: str, status: str = "pass") -> dict:
    return ModelRow(model=model, config="tiny", backend="pfvm:cpu", steps=1, time_kind="measured wall time",
                    status=status, reason="", repro="", graphs_per_step=1, compiles_after_warmup=0).to_json()


def _fake_children(tmp_path, monkeypatch, script: str) -> None:
    """Children run ``script`` (Python; ``MODEL`` and ``OUT`` are the child's --model and --out) instead
    of the runner: canned rows in milliseconds, and faults where the script puts them."""
    import sys

    fake = tmp_path / "fake_python"
    fake.write_text(f"#!{sys.executable}\nimport json, os, signal, sys, time\nfrom pathlib import Path\n"
                    "argv = sys.argv\nMODEL, OUT = argv[argv.index('--model') + 1], Path(argv[argv.index('--out') + 1])\n"
                    + script)
    fake.chmod(0o755)
    monkeypatch.setattr(cells, "PYTHON", str(fake))


def test_hung_model_times_out_and_others_still_report(tmp_path, monkeypatch):
    """The hung child (sleeps 600 s) times out; the other one writes its canned row at once, so nothing
    here depends on how fast a real model trains."""
    (tmp_path / "row.json").write_text(json.dumps(_canned_row("mlp_w64")))
    _fake_children(tmp_path, monkeypatch, f"if MODEL == 'mlp_w128':\n    time.sleep(600)\n"
                                          f"OUT.write_text(Path({str(tmp_path / 'row.json')!r}).read_text())\n")
    rows = tiers.run_models([("mlp_w128", "tiny"), ("mlp_w64", "tiny")], ["pfvm:cpu"], steps=1, out=tmp_path / "r",
                            timeout=20, jobs=2)
    by_model = {r.model: r for r in rows}
    assert by_model["mlp_w128"].status == "timeout"
    assert by_model["mlp_w64"].status == "pass"


def test_stale_row_of_an_earlier_run_is_never_read(tmp_path, monkeypatch):
    """A reused --out: the earlier run's child for mlp_w128 (left running) writes its pass row late, while
    this run's child is killed early. The row must not be read: this run's rows live under its own run id."""
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(_canned_row("mlp_w128")))
    where = tmp_path / "earlier_row_path"
    _fake_children(tmp_path, monkeypatch, f"Path({str(where)!r}).write_text(str(OUT))\n"
                                          f"OUT.write_text(Path({str(stale)!r}).read_text())\n")
    (earlier,) = tiers.run_models([("mlp_w128", "tiny")], ["pfvm:cpu"], steps=1, out=tmp_path / "r", timeout=60)
    assert earlier.status == "pass"
    # this run: the earlier run's leftover writes its row where that run read rows; this child is SIGKILLed
    _fake_children(tmp_path, monkeypatch, f"Path(Path({str(where)!r}).read_text()).write_text("
                                          f"Path({str(stale)!r}).read_text())\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (row,) = tiers.run_models([("mlp_w128", "tiny")], ["pfvm:cpu"], steps=1, out=tmp_path / "r", timeout=60)
    assert row.status == "oom" and "-9" in row.reason, row


def test_lazy_step_counters_are_read_after_the_device_finished():
    """graphs_per_step is counted by the worker when a graph finishes: read right after an async sync() it
    gave 0 or 2 at random. On a slow device (each relu sleeps 50 ms on the worker, values unchanged) the
    step's own graph is always still running then (a 1-step run counted 0); the counts must be exact for
    every run length, in async execution."""
    import model_zoo

    relu = torch.ops.aten.relu.default

    def slow_relu(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return torch.relu(x)

    mncore.register_lowering(relu, slow_relu)
    try:
        for steps in (1, 2, 3):
            res = runner.run_lazy(model_zoo.get("mlp_w64"), "tiny", "pfvm:cpu", steps=steps, seed=0)
            assert mncore.config.current().execution == "async"
            assert (res["graphs_per_step"], res["compiles_after_warmup"]) == (1, 0), res
    finally:
        mncore.unregister_lowering(relu)


def test_expected_mismatch_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path)
    good = {"model": "m", "config": "tiny", "backend": "pfvm:cpu", "status": "pass", "graphs_per_step": 1,
            "compiles_after_warmup": 0, "lazy_captured_status": "pass", "lazy_captured_replays_per_step": 1.0}
    expectations.update([good], "models", "pfvm:cpu")
    assert expectations.check([good], "models", "pfvm:cpu") == []
    worse = dict(good, status="fail_accuracy")
    assert any("regression" in p for p in expectations.check([worse], "models", "pfvm:cpu"))
    better_exp = dict(good, status="fail_to_run")
    expectations.update([better_exp], "models", "pfvm:cpu")
    found = expectations.check([good], "models", "pfvm:cpu")
    assert any("improvement" in p and p.startswith("models_pfvm_cpu.csv: ") for p in found), found
    more_graphs = dict(good, graphs_per_step=3)
    expectations.update([good], "models", "pfvm:cpu")
    assert any("graphs_per_step" in p for p in expectations.check([more_graphs], "models", "pfvm:cpu"))
    captured_fails = dict(good, lazy_captured_status="fail_to_run")
    found = expectations.check([captured_fails], "models", "pfvm:cpu")
    assert found == ["models_pfvm_cpu.csv: m:tiny: lazy_captured_status 'pass' -> 'fail_to_run' (regression)"]
    traced = dict(good, lazy_captured_replays_per_step=0.0)
    found = expectations.check([traced], "models", "pfvm:cpu")
    assert found == ["models_pfvm_cpu.csv: m:tiny: lazy_captured_replays_per_step '1.0' -> '0.0' (change)"]


def test_expectations_without_the_captured_columns_still_load(tmp_path, monkeypatch):
    """A file written before the captured mode existed reads its columns as '' (a refresh fills them)."""
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path)
    (tmp_path / "models_pfvm_cpu.csv").write_text("model,config,status,graphs_per_step,compiles_after_warmup\n"
                                                 "m,tiny,pass,1,0\n")
    (tmp_path / "perf_models_pfvm_cpu.csv").write_text(
        "model,config,backend,eager_step_ms,lazy_step_ms,context_step_ms,trace_ms\nm,tiny,pfvm:cpu,1,2,1,1\n")
    got = expectations.load_expected("models", "pfvm:cpu")[("m", "tiny")]
    assert got["status"] == "pass" and got["lazy_captured_status"] == got["lazy_captured_replays_per_step"] == ""
    assert expectations.load_perf("models", "pfvm:cpu")[("m", "tiny")]["lazy_captured_step_ms"] == ""
    (tmp_path / "models_pfvm_cpu.csv").write_text("model,config,status,graphs_per_step,compiles_after_warmup,"
                                                 "lazy_captured_status\nm,tiny,pass,1,0,replayed\n")
    with pytest.raises(expectations.ExpectationsError, match="lazy_captured_status 'replayed'"):
        expectations.load_expected("models", "pfvm:cpu")


def test_results_rows_without_the_captured_mode_still_load():
    """Results files written before the captured mode: its fields default to not measured."""
    old = {k: v for k, v in _canned_row("mlp_w64").items() if "captured" not in k}
    row = ModelRow.from_json(old, where="an old results file")
    assert row.lazy_captured.status is None and row.lazy_captured.replays_per_step is None
    assert not any("captured" in k for k in row.to_json())


def _fake_rows(*models: str, **fields) -> list[ModelRow]:
    return [ModelRow(model=m, config="tiny", backend="pfvm:cpu", status="pass", graphs_per_step=1,
                     compiles_after_warmup=0, steps=1, time_kind="measured wall time", reason="", repro="",
                     **fields) for m in models]


def test_cli_exits_nonzero_on_expected_mismatch(tmp_path, monkeypatch):
    from harness import cli

    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    fake = _fake_rows("mlp_w64")
    monkeypatch.setattr(tiers, "run_models", fake_run_models(fake))
    expectations.update([dict(fake[0].to_json(), graphs_per_step=2)], "models", "pfvm:cpu")
    assert cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny", "--out", str(tmp_path / "r")]) == 1
    expectations.update([fake[0].to_json()], "models", "pfvm:cpu")
    assert cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny", "--out", str(tmp_path / "r2")]) == 0


def test_update_expected_replaces_only_the_rows_that_ran(tmp_path, monkeypatch):
    """``--update-expected --models mlp_w64`` once rewrote both files with that one row; the others stay."""
    from harness import cli

    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    before = _fake_rows("mlp_w64", "mlp_w128", "resnet18")
    expectations.update([dict(r.to_json(), status="fail_to_run") for r in before], "models", "pfvm:cpu")
    monkeypatch.setattr(tiers, "run_models", fake_run_models(_fake_rows("mlp_w64")))
    argv = ["run", "--tier", "models", "--models", "mlp_w64:tiny", "--update-expected", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 0
    got = expectations.load_expected("models", "pfvm:cpu")
    assert {k: v["status"] for k, v in got.items()} == {
        ("mlp_w64", "tiny"): "pass", ("mlp_w128", "tiny"): "fail_to_run", ("resnet18", "tiny"): "fail_to_run"}
    assert set(expectations.load_perf("models", "pfvm:cpu")) == set(got)


def test_update_expected_over_the_whole_tier_drops_models_no_longer_in_it(tmp_path, monkeypatch):
    """A model that left the tier kept its row, and the next plain run failed with "expected but not run"."""
    from harness import cli

    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    expectations.update([r.to_json() for r in _fake_rows("mlp_w64", "gone")], "models", "pfvm:cpu")
    monkeypatch.setattr(tiers, "models_tier", lambda: [("mlp_w64", "tiny")])
    monkeypatch.setattr(tiers, "run_models", fake_run_models(_fake_rows("mlp_w64")))
    argv = ["run", "--tier", "models", "--backend", "pfvm:cpu", "--update-expected", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 0
    assert set(expectations.load_expected("models", "pfvm:cpu")) == {("mlp_w64", "tiny")}
    assert set(expectations.load_perf("models", "pfvm:cpu")) == {("mlp_w64", "tiny")}
    assert cli.main(argv[:-3] + ["--out", str(tmp_path / "r2")]) == 0  # the plain run agrees with the file


def test_result_files_round_trip_into_pandas(tmp_path):
    """A real row (every mode passes) written and read back; the captured mode replayed every measured step."""
    rows = [runner.run_one("mlp_w64", "tiny", "pfvm:cpu", steps=2)]
    captured = rows[0].lazy_captured
    assert (captured.status, captured.reason, captured.warmup, captured.replays_per_step) == ("pass", "", 3, 1.0)
    assert len(captured.losses) == len(rows[0].eager_losses) == 2 + runner.CAPTURE_WARMUP + runner.CAPTURE_TAIL
    assert rows[0].captured_context_ratio == pytest.approx(captured.step_ms / rows[0].context.step_ms)
    jsonl, csv, _ = write_results(rows, tmp_path, tiers.metadata("models", 2), stamp=True)
    back = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert back[0]["model"] == "mlp_w64" and back[0]["status"] == "pass"
    # Exact on purpose: the losses are not recomputed, only written and read back, and JSON writes a
    # float64 as its shortest round-tripping repr, so anything but equality is a lossy results file.
    assert back[0]["lazy_losses"] == rows[0].lazy.losses
    df = pd.read_csv(csv)
    assert list(df["model"]) == ["mlp_w64"] and df.loc[0, "status"] == "pass"
    assert {"lazy_step_ms", "context_step_ms", "graphs_per_step", "backend", "time_kind", "lazy_captured_step_ms",
            "lazy_captured_status", "lazy_captured_replays_per_step"} <= set(df.columns)
    assert json.loads(df.loc[0, "eager_losses"]) == rows[0].eager_losses  # a round trip too: exact
    assert back[0]["lazy_captured_losses"] == captured.losses  # exact: written and read back
    assert "lazy_captured_replays_per_step" in run_summary.figures_table(back).columns
    assert run_summary.mode_statuses(back[0]) == {"eager": "pass", "lazy": "pass", "captured": "pass", "Context": "pass"}


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


def test_accuracy_runs_switch_off_stochastic_depth_too():
    """Stochastic depth drops whole residual branches at random, and mncore's random stream is not eager's:
    left on, it made ``tv_swin3d_t`` fail accuracy in every mode (RMSE 0.4 against eager's 2e-7). After
    ``disable_dropout`` a training-mode forward is the eval-mode forward, whatever the random state."""
    from torchvision.ops import StochasticDepth
    from transformers.models.swin.modeling_swin import SwinDropPath

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), StochasticDepth(0.5, "row"), torch.nn.Linear(8, 8),
                                SwinDropPath(0.5), torch.nn.Dropout(0.5))
    x = torch.randn(16, 8)
    runner.disable_dropout(model)
    with torch.no_grad():
        ref = model.eval()(x)
        model.train()
        for seed in range(3):
            torch.manual_seed(seed)
            torch.testing.assert_close(model(x), ref)  # a dropped branch or element would be off by 100 %


def test_accuracy_runs_switch_off_router_jitter_noise():
    """Switch Transformers' routers scale their input by uniform noise in training (``router_jitter_noise``,
    0.01 by default), so expert choices differed from eager's and the model failed accuracy on every backend.
    After ``disable_dropout`` the training loss no longer depends on the random state."""
    import model_zoo

    spec = model_zoo.get("hf_switch_transformers")
    _assert_loss_ignores_the_random_state(spec, runner.disable_dropout(spec.build("tiny", seed=0)))


def _assert_loss_ignores_the_random_state(spec, model: torch.nn.Module) -> None:
    """The training-mode loss of ``model`` on one batch is the same under three random seeds (torch's and
    numpy's: transformers draws SpecAugment masks from numpy)."""
    import numpy as np

    model.train()
    batch = spec.make_batch("tiny", seed=0)
    losses = []
    for seed in range(3):
        torch.manual_seed(seed)
        np.random.seed(seed)
        with torch.no_grad():
            losses.append(spec.loss(model, batch))
    for loss in losses[1:]:
        torch.testing.assert_close(loss, losses[0])


def test_accuracy_runs_switch_off_dropout_rates_kept_as_attributes():
    """Seed-OSS applies ``F.dropout(x, p=self.residual_dropout)`` with a rate it keeps as an attribute (no
    ``nn.Dropout`` layer): left on, every mode failed accuracy (loss RMSE 5e-3 against eager's 3e-7). After
    ``disable_dropout`` the training loss no longer depends on the random state."""
    import model_zoo

    spec = model_zoo.get("hf_seed_oss")
    model = spec.build("tiny", seed=0)
    rates = {(n, a): v for n, m in model.named_modules() for a, v in vars(m).items()
             if a == "residual_dropout"}
    assert rates and all(v > 0 for v in rates.values()), rates  # the tiny config does drop (else no test)
    _assert_loss_ignores_the_random_state(spec, runner.disable_dropout(model))


def test_accuracy_runs_switch_off_rates_and_masks_read_from_the_config():
    """HuBERT draws SpecAugment time masks with numpy (``config.mask_time_prob``) while training, and
    wav2vec2-style encoders skip layers at random (``config.layerdrop``): eager float32 and float64 runs
    already disagreed (loss RMSE 0.23), so its accuracy verdict was a coin toss. After ``disable_dropout``
    the training loss no longer depends on the random state."""
    import model_zoo

    spec = model_zoo.get("hf_hubert")
    model = spec.build("tiny", seed=0)
    assert model.config.mask_time_prob > 0  # the tiny config does mask (else no test)
    _assert_loss_ignores_the_random_state(spec, runner.disable_dropout(model))


def test_switching_randomness_off_leaves_the_next_build_alone():
    """Catalog models each get a config of their own: ``disable_dropout`` on one model (its config's
    ``mask_time_prob``) once leaked into the next build of the same model type, which then lacked the
    ``masked_spec_embed`` parameter, and the runner's state comparison crashed with a KeyError."""
    import model_zoo

    spec = model_zoo.get("hf_hubert")
    first = runner.disable_dropout(spec.build("tiny", seed=0))
    second = spec.build("tiny", seed=0)
    assert first.config.mask_time_prob == 0 and second.config.mask_time_prob > 0
    assert set(first.state_dict()) == set(second.state_dict())


def _assert_gradients_ignore_the_random_state(spec, model: torch.nn.Module) -> None:
    """The training-mode gradients of ``model`` on one batch are the same under three torch seeds (for
    models whose loss, a mean square of layer-normed tokens, is near 1 whatever the random state did)."""
    model.train()
    batch = spec.make_batch("tiny", seed=0)
    grads = []
    for seed in range(3):
        torch.manual_seed(seed)
        model.zero_grad()
        spec.loss(model, batch).backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for other in grads[1:]:  # a random order of tokens still changes the order of the float32 sums
        for a, b in zip(grads[0], other):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_accuracy_runs_switch_off_masked_autoencoder_masking():
    """ViT-MAE hides a random 75 % of its patches on every call (``config.mask_ratio``): lazy and captured
    runs draw other masks than eager CPU, so their verdicts were a coin toss. After ``disable_dropout``
    nothing is masked and the gradients no longer depend on the random state (the patches' random order
    changes neither the mean square nor the gradients, sums over patches)."""
    import model_zoo

    spec = model_zoo.get("hf_vit_mae")
    model = spec.build("tiny", seed=0)
    assert model.config.mask_ratio > 0  # the tiny config does mask (else no test)
    _assert_gradients_ignore_the_random_state(spec, runner.disable_dropout(model))


def test_accuracy_runs_switch_off_random_rotary_coordinates():
    """DINOv3's RoPE shifts, jitters and rescales its patch coordinates at random while training
    (``pos_embed_rescale`` is 2.0 by default): CHMv2, a depth model on a DINOv3 backbone, failed accuracy in
    every mode (the rotary embeddings' mean square differed by 5 % between the eager float32 and float64
    runs). After ``disable_dropout`` the features no longer depend on the random state."""
    import model_zoo
    from model_zoo.catalog.hf import first_float

    spec = model_zoo.get("hf_dinov3_vit")
    model = spec.build("tiny", seed=0)
    assert model.config.pos_embed_rescale is not None  # the tiny config does augment (else no test)
    runner.disable_dropout(model).train()
    batch = spec.make_batch("tiny", seed=0)
    outs = []
    for seed in range(3):  # its features, not its loss (a mean square near 1), show the coordinates
        torch.manual_seed(seed)
        with torch.no_grad():
            outs.append(first_float(model(**batch)))
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0])


@pytest.mark.parametrize("where", ["purelib", "checkout"])
def test_a_failure_reason_reads_the_same_wherever_the_checkout_is(where: str):
    """Expected reasons (`ci/expected`) are compared as text: the message is cut at 500 characters after
    the installation's or checkout's directory is taken off, so its length does not depend on that path
    (cut before, `make run` in a clone at another path failed on every `not_compilable` row)."""
    base = sysconfig.get_paths()["purelib"] if where == "purelib" else str(Path(runner.__file__).parent.parent)
    message = "nonzero at " + "transformers/models/x.py:7 in forward: " + "y" * 600
    got = runner._reason(RuntimeError(message.replace("transformers/", base + "/transformers/")))
    assert got == "RuntimeError: " + message[:500]
