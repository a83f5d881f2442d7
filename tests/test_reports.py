"""``harness report``: rendering from results files, ``--from`` without running, a tiny real measurement."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

import mncore
from harness import cli, perf
from harness.results import write_results
from reports import page, tables
from reports.results import load, split_peers
from reports.schema import PEER_BACKEND, Measurement, PerfRow

pytestmark = pytest.mark.unit

META = {"commit": "abc1234", "torch": "9.9.9-test", "python": "3.11.0", "platform": "Linux-test",
        "machine": "x86_64, 2 cores", "cores": 2, "gpu": "none", "when": "2026-01-01T00:00:00",
        "loadavg_start": [0.1, 0.2, 0.3], "steps": 3, "warmup": 2, "config": "default",
        "command": "harness report all"}


def _spread(prefix: str, key: str, v: float) -> dict:
    """Median, min and max of ``key`` (and the mean, which the step time alone has)."""
    out = {f"{prefix}{key}": v, f"{prefix}{key}_min": v * 0.9, f"{prefix}{key}_max": v * 1.2}
    if key == "step_ms":
        out[f"{prefix}{key}_mean"] = v
    return out


def _write(rows: list[dict], d: Path, meta: dict) -> None:
    """``results.jsonl`` etc. of plain records, as the runners write them (checked against the schema)."""
    write_results([PerfRow.from_json(r, where="test row") for r in rows], d, meta)


def _compare_row(report: str, model: str, backend: str, context_ms: float, lazy_ms: float, trace: float,
                 device: float, kind: str = perf.MEASURED, width: int | None = None,
                 captured_ms: float | None = None, replays: float = 1.0) -> dict:
    row = {"report": report, "model": model, "config": "default", "backend": backend, "device": backend,
           "sim_mode": None, "batch": 64, "steps": 3, "warmup": 2, "status": "ok", "reason": "", "execution": "async",
           "time_kind": kind, "trace_ms": trace, "device_ms": device, "ratio": lazy_ms / context_ms,
           "bound": "trace-bound" if trace > device else "device-bound"}
    if width:
        row["width"] = width
    apis = [("context", context_ms), ("lazy", lazy_ms)]
    if captured_ms is not None:
        apis.append(("lazy_captured", captured_ms))
        row.update(captured_ratio=captured_ms / context_ms, lazy_captured_replays_per_step=replays)
    for api, step in apis:
        row.update(_spread(f"{api}_", "step_ms", step))
        row.update(_spread(f"{api}_", "trace_ms", trace if api == "lazy" else 0.0))
        row.update(_spread(f"{api}_", "device_ms", device))
        row.update({f"{api}_wait_ms": 0.5, f"{api}_compile_ms": 0.0, f"{api}_dispatch_ms": trace / 3,
                    f"{api}_sync_ms": 0.2, f"{api}_idle_ms": max(step - device, 0), f"{api}_warmup_compile_s": 0.1})
    return row


def _unavailable(report: str, model: str) -> dict:
    return {"report": report, "model": model, "config": "default", "backend": "mncore2:auto (performance)",
            "device": "mncore2:auto", "sim_mode": "performance", "steps": 3, "warmup": 2, "status": "unavailable",
            "reason": "unavailable: device 'mncore2:auto' is not available in this build yet",
            "time_kind": perf.MODELLED}


def _synthetic(root: Path) -> None:
    """Results files for all three reports, as ``harness report`` writes them (no model is run)."""
    mlp = [_compare_row("mlp-width", f"mlp_w{w}", "pfvm:cpu", c, l, t, dv, width=w, captured_ms=cap, replays=rep)
           for w, c, l, t, dv, cap, rep in ((64, 1.0, 4.0, 3.5, 0.8, 1.5, 1.0),
                                            (1024, 20.0, 24.0, 4.0, 19.0, 21.0, 0.5),
                                            (4096, 400.0, 410.0, 4.0, 399.0, 402.0, 1.0))]
    mlp.append(_unavailable("mlp-width", "mlp_w64"))
    _write(mlp, root / "mlp-width", {**META, "report": "mlp-width"})
    d = root / "async"
    rows = []
    for mode, step, trace, device in (("sync", 60.0, 25.0, 30.0), ("async_naive", 45.0, 30.0, 35.0),
                                      ("async", 36.0, 24.0, 35.0)):
        events, bounds = [], [0.0]
        for i in range(3):
            s = bounds[-1]
            events += [["host", "trace", s, s + trace, {}], ["host", "sync (user)", s + trace, s + trace + 1, {}],
                       ["worker", "prepare g", s + trace + 1, s + trace + 1.1, {}],
                       ["device", "g", s + trace + 1.1, s + trace + 1.1 + device, {"time": "measured"}]]
            bounds.append(s + step)
        tl = d / "timelines" / f"gpt2_small_pfvm_cpu_{mode}.json"
        tl.parent.mkdir(parents=True, exist_ok=True)
        tl.write_text(json.dumps({"bounds_ms": bounds, "events": events}))
        row = {"report": "async", "model": "gpt2_small", "config": "default", "backend": "pfvm:cpu",
               "device": "pfvm:cpu", "sim_mode": None, "batch": 2, "steps": 3, "warmup": 2, "status": "ok",
               "reason": "", "api": "lazy", "execution": mode, "time_kind": perf.MEASURED, "util": device / step,
               "bound": "device-bound", "timeline_file": str(tl.relative_to(d)),
               "chrome_trace": f"traces/gpt2_small_pfvm_cpu_{mode}.trace.json"}
        for key, v in (("step_ms", step), ("trace_ms", trace), ("device_ms", device), ("idle_ms", step - device)):
            row.update(_spread("", key, v))
        rows.append(row)
    rows.append(_unavailable("async", "gpt2_small"))
    _write(rows, d, {**META, "report": "async"})
    models = [_compare_row("models", "resnet18", "pfvm:cpu", 3000.0, 3100.0, 300.0, 2900.0, captured_ms=2950.0),
              _compare_row("models", "gpt2_small", "pfvm:cpu", 2000.0, 2600.0, 400.0, 2000.0)]
    _write(models, root / "models", {**META, "report": "models"})


def _forbid_running(monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("a re-render must not run any model")

    for name in ("run_cells", "run_cell", "measure_lazy", "measure_context"):
        monkeypatch.setattr(perf, name, boom)


def test_render_from_synthetic_results_without_running(tmp_path, monkeypatch):
    _synthetic(tmp_path)
    _forbid_running(monkeypatch)
    before = mncore.metrics.counters()["graphs_executed"]
    assert cli.main(["report", "all", "--from", str(tmp_path)]) == 0
    assert mncore.metrics.counters()["graphs_executed"] == before  # no mncore graph ran
    for f in ("mlp-width/mlp_width_ratio.png", "mlp-width/report.md", "async/timeline_pfvm_cpu.png",
              "async/report.md", "models/models_breakdown.png", "models/report.md", "index.md", "index.html"):
        assert (tmp_path / f).stat().st_size > 200, f
    csv = pd.read_csv(tmp_path / "mlp-width" / "results.csv")
    assert {"backend", "width", "ratio", "time_kind", "lazy_step_ms", "context_step_ms", "steps"} <= set(csv.columns)
    index = (tmp_path / "index.md").read_text()
    for needle in ("abc1234", "9.9.9-test", "x86_64, 2 cores", "measured wall time", "mlp-width/mlp_width_ratio.png",
                   "async/timeline_pfvm_cpu.png", "unavailable: device 'mncore2:auto'", "3 (after 2)",
                   "load average", "1.10", "639 ms / 166 ms / 74%"):
        assert needle in index, needle
    # targets, judged on the synthetic ratios: 4.0 at w=64 (> 3.0), 410/400 = 1.025 at w=4096 (<= 1.05);
    # async: device 35 > trace 24 and step 36 <= 1.05 * 35
    verdicts = {(t.report, t.what): t.verdict for n in ("mlp-width", "async")
                for t in tables.targets(n, load(tmp_path / n)[1])}
    assert verdicts[("mlp-width", "lazy/Context at w=64")] == "NOT met"
    assert verdicts[("mlp-width", "lazy/Context at w=4096")] == "met"
    assert verdicts[("async", "async step / max(trace, device)")] == "met"
    assert "NOT met" in index and "<img src=\"mlp-width/mlp_width_ratio.png\"" in (tmp_path / "index.html").read_text()
    table = tables.mlp_table(load(tmp_path / "mlp-width")[1])
    assert list(table["width"]) == [64, 1024, 4096] and table.iloc[0]["lazy/Context"] == "4.00"
    assert table.iloc[0]["Context ms/step"] == "1.00 [0.90–1.20]"
    assert table.iloc[0]["captured ms/step"] == "1.50 [1.35–1.80]" and table.iloc[0]["captured/Context"] == "1.50"
    # the captured column, and why a captured figure is partly traced steps, in the report and on the page
    md = (tmp_path / "mlp-width" / "report.md").read_text()
    assert "| captured ms/step | captured/Context |" in md
    assert "mlp_w1024 on pfvm:cpu: replayed 50% of the timed steps (recordings in the timed window" in md
    models = tables.models_table(load(tmp_path / "models")[1]).set_index("model")
    assert models.loc["resnet18", "captured/Context"] == "0.98"
    assert models.loc["gpt2_small", "captured/Context"] == "–"
    apis = tables.breakdown_table(load(tmp_path / "models")[1]).groupby("model")["API"].apply(list)
    assert apis["resnet18"] == ["lazy", "captured lazy", "Context"] and apis["gpt2_small"] == ["lazy", "Context"]
    assert "captured/Context" in index
    assert list(tables.async_table(load(tmp_path / "async")[1])["mode"]) == ["sync", "async naive", "async (optimized)"]


def test_from_into_another_root_and_publish(tmp_path, monkeypatch):
    src, dst, pub = tmp_path / "src", tmp_path / "dst", tmp_path / "pub"
    _synthetic(src)
    _forbid_running(monkeypatch)
    assert cli.main(["report", "all", "--from", str(src), "--out", str(dst), "--publish", str(pub)]) == 0
    assert (dst / "index.html").exists() and (dst / "async" / "results.jsonl").exists()
    assert not (src / "index.md").exists()  # the source is only read
    published = sorted(str(p.relative_to(pub)) for p in pub.rglob("*") if p.is_file())
    assert "index.md" in published and "mlp-width/mlp_width_ratio.png" in published
    assert {"async/results.csv", "async/results.jsonl", "async/timelines/gpt2_small_pfvm_cpu_async.json"} <= set(published)
    assert not any("traces" in p for p in published)
    # a single report re-rendered from its own directory
    assert cli.main(["report", "models", "--from", str(src / "models")]) == 0
    assert (src / "models" / "report.md").exists()


def test_overlap_by_bisection_equals_the_sum_over_every_span():
    """``perf._overlap`` bisects into the sorted, disjoint spans; the reference sums over all of them."""
    rng = random.Random(0)
    for _ in range(200):
        points = sorted(rng.uniform(0, 100) for _ in range(2 * rng.randint(0, 12)))
        spans = perf._union(list(zip(points[::2], points[1::2])))
        lo, hi = sorted(rng.uniform(-10, 110) for _ in range(2))
        reference = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)
        assert perf._overlap(spans, lo, hi) == pytest.approx(reference, rel=1e-12, abs=1e-12)


def test_analyse_step_trace_device_idle():
    events = [("host", "trace", -5.0, 1.0, {}), ("device", "g", 1.5, 2.5, {"time": "modelled"}),
              ("host", "trace", 2.0, 3.0, {}), ("device", "g", 3.5, 4.0, {"time": "modelled"})]
    res = perf.analyse(events, [0.0, 2.0, 4.0])
    # host steps end at 2 and 4; the device completes step 1 at 2.5 and step 2 at 4.0
    # computed from seconds (differences, then * 1e3): equal up to rounding, hence approx's default rel=1e-6
    assert res["step_basis"] == "device completions" and res["per_step"]["step_ms"] == pytest.approx([1500.0])
    assert res["per_step"]["trace_ms"] == pytest.approx([1000.0, 1000.0])  # per host step, clipped to the window
    assert res["per_step"]["device_ms"] == pytest.approx([1000.0, 500.0])
    assert res["per_step"]["idle_ms"] == pytest.approx([1000.0]) and res["util"] == pytest.approx(1 / 3)
    # the same steps: interval 1.5 s, host trace 1.0 s, device 0.5 s
    assert res["pipeline_ratio"] == pytest.approx(1.5) and res["pipeline_device_ms"] == pytest.approx(500.0)
    assert perf.analyse(events[:3], [0.0, 2.0, 4.0])["step_basis"] == "host step ends"  # 1 graph for 2 steps
    assert perf.time_kind(perf.Backend("mncore2:auto", "performance"), res["device_time_kinds"]) == perf.MODELLED
    assert perf.Backend.parse("mncore2:auto").sim_mode == "performance"
    assert perf.Backend.parse("pfvm:cpu").label == "pfvm:cpu"


def test_tiny_real_measurement_rows_are_consistent(tmp_path):
    rows = perf.run_cell({"report": "mlp-width", "kind": "compare", "model": "mlp_w64", "config": "tiny",
                          "backend": "pfvm:cpu", "steps": 2, "warmup": 3, "execution": "async"})
    (row,) = rows
    assert row.status == "ok", row.reason
    assert row.width == 64 and row.time_kind == perf.MEASURED
    for k in ("context_step_ms", "lazy_step_ms", "lazy_trace_ms", "lazy_device_ms", "context_device_ms", "ratio"):
        assert row.to_json()[k] > 0, k
    assert row.ratio == pytest.approx(row.lazy.step_ms / row.context.step_ms)
    # exact on purpose: a median of floats never leaves their [min, max] (no arithmetic can overshoot it)
    assert row.lazy.step_ms_min <= row.lazy.step_ms <= row.lazy.step_ms_max
    # exact on purpose: the Context API records no trace spans (a sum of nothing) and the counts are integers
    assert row.context.trace_ms == 0 and row.lazy.compiles == 0 and row.lazy.graphs_per_step == 1
    # captured lazy: the same warm-up covers capture's three recordings, so every timed step replayed
    assert row.lazy_captured.replays_per_step == 1.0 and row.lazy_captured.graphs_per_step == 1
    assert row.lazy_captured.capture_warning is None and row.lazy_captured_time_kind == perf.MEASURED
    assert row.captured_ratio == pytest.approx(row.lazy_captured.step_ms / row.context.step_ms)
    assert row.lazy_captured.loss == pytest.approx(row.lazy.loss, rel=1e-5)  # the same step, the same batches
    bad = perf.run_cell({"report": "mlp-width", "kind": "compare", "model": "mlp_w64", "config": "tiny",
                         "backend": "pfvm:tpu", "steps": 2, "warmup": 1})
    assert bad[0].status == "unavailable" and bad[0].reason.startswith("unavailable: ")
    write_results(rows + bad, tmp_path / "mlp-width", {**META, "report": "mlp-width", "steps": 2})
    md = page.render_report(tmp_path / "mlp-width", "mlp-width").read_text()
    assert "pfvm:tpu: unavailable" in md and "| pfvm:cpu | 64 |" in md


def test_captured_failure_keeps_the_row_ok(monkeypatch):
    """Captured lazy failing is said in ``captured_error`` and in the report's notes; the lazy and Context
    figures of the row stay (the row is not an error)."""
    measure = perf.measure_lazy

    def fake(*args, capture=False, **kwargs):
        if capture:
            raise RuntimeError("capture broke")
        return measure(*args, **kwargs)

    monkeypatch.setattr(perf, "measure_lazy", fake)
    (row,) = perf.run_cell({"report": "mlp-width", "kind": "compare", "model": "mlp_w64", "config": "tiny",
                            "backend": "pfvm:cpu", "steps": 2, "warmup": 1, "execution": "async"})
    assert row.status == "ok" and row.captured_error == "lazy_captured: RuntimeError: capture broke"
    assert row.ratio is not None and row.captured_ratio is None and row.lazy_captured.step_ms is None
    df = pd.DataFrame([row.to_json()])
    assert tables.capture_notes(df) == ["mlp_w64 on pfvm:cpu: not measured: lazy_captured: RuntimeError: capture broke"]
    assert tables.mlp_table(df).iloc[0]["captured ms/step"] == "–"


def test_a_captured_child_that_dies_leaves_the_cell_ok():
    """The three children of a compare cell merged: the captured one timing out is said in ``captured_error``;
    the lazy and Context figures (and their ratio) make the row."""
    full = PerfRow.from_json(_compare_row("mlp-width", "mlp_w64", "pfvm:cpu", 2.0, 4.0, 3.0, 1.0, width=64), "test")
    context, lazy = PerfRow.from_json(full.to_json(), "context"), PerfRow.from_json(full.to_json(), "lazy")
    context.lazy = Measurement()
    lazy.context = Measurement()
    cell = {"report": "mlp-width", "model": "mlp_w64", "config": "default", "steps": 3, "warmup": 3}
    backend = perf.Backend("pfvm:cpu")
    died = perf._stub_row(cell, backend, "timeout", "no result after 3s")
    row = perf._merge_compare([[context], [lazy], [died]], backend, perf._parts({"kind": "compare"}))
    assert row.status == "ok" and row.captured_error == "lazy_captured: timeout: no result after 3s"
    assert row.ratio == 2.0 and row.captured_ratio is None  # exact: 4.0 / 2.0


def _child(api: str, step_ms: float, status: str = "ok") -> PerfRow:
    """One child's row of a compare cell: only ``api`` measured, its median step ``step_ms``."""
    row = PerfRow.from_json({**_compare_row("mlp-width", "mlp_w64", "pfvm:cpu", 1.0, 1.0, 0.5, 0.2, width=64,
                                            captured_ms=1.0), "status": status}, api)
    for other in perf.APIS:
        setattr(row, other, Measurement(step_ms=step_ms, step_ms_min=step_ms) if other == api else Measurement())
    return row


def test_rounds_interleave_the_apis_and_rotate_which_goes_first(tmp_path):
    """Three rounds of a compare cell: nine children, each API once per round, each round starting one API
    later, so no API is always timed first (after a process start) or last (after the machine warmed)."""
    cell = {"report": "mlp-width", "kind": "compare", "model": "mlp_w64", "config": "tiny", "backend": "pfvm:cpu",
            "sim_mode": None, "steps": 3, "warmup": 3, "rounds": 3}
    parts = perf._parts(cell)
    assert parts == [("context", 0), ("lazy", 0), ("lazy_captured", 0), ("lazy", 1), ("lazy_captured", 1),
                     ("context", 1), ("lazy_captured", 2), ("context", 2), ("lazy", 2)]
    jobs = perf._jobs(0, cell, perf.Backend("pfvm:cpu"), tmp_path)
    assert [json.loads(j.args[1])["apis"] for j in jobs] == [[api] for api, _ in parts]
    assert len({j.result for j in jobs}) == 9 and jobs[3].label == "mlp_w64 on pfvm:cpu (lazy, round 2 of 3)"
    assert perf._parts({**cell, "rounds": 1}) == [("context", 0), ("lazy", 0), ("lazy_captured", 0)]


def test_rounds_merge_keeps_each_apis_median_round_and_every_rounds_step():
    """Each API's figures come from its median round (a round slowed by the machine is left out), the
    ratios from those medians, and ``round_step_ms`` lists each round's step in the order they ran."""
    cell = {"kind": "compare", "rounds": 3}
    steps = {"context": [2.0, 9.0, 2.2], "lazy": [8.0, 8.4, 30.0], "lazy_captured": [2.4, 2.3, 2.6]}
    seen = {api: iter(v) for api, v in steps.items()}
    children = [[_child(api, next(seen[api]))] for api, _ in perf._parts(cell)]
    row = perf._merge_compare(children, perf.Backend("pfvm:cpu"), perf._parts(cell))
    assert row.status == "ok"
    assert (row.context.step_ms, row.lazy.step_ms, row.lazy_captured.step_ms) == (2.2, 8.4, 2.4)
    assert row.context.round_step_ms == steps["context"] and row.lazy.round_step_ms == steps["lazy"]
    assert row.ratio == pytest.approx(8.4 / 2.2) and row.captured_ratio == pytest.approx(2.4 / 2.2)


def test_a_round_that_fails_makes_the_row_say_so():
    """A failed round of lazy mode is not outvoted by the rounds that worked: the row is an error naming it;
    a failed round of captured lazy mode is said in ``captured_error`` and the other figures stay."""
    cell = {"kind": "compare", "rounds": 2}
    backend = perf.Backend("pfvm:cpu")
    stub = {"report": "mlp-width", "model": "mlp_w64", "config": "default", "steps": 3, "warmup": 3}
    for broken, check in (("lazy", lambda r: r.status == "timeout" and "no result" in r.reason),
                          ("lazy_captured", lambda r: r.status == "ok" and r.ratio == pytest.approx(4.0)
                           and r.captured_error == "lazy_captured: timeout: no result after 3s")):
        children = [[perf._stub_row(stub, backend, "timeout", "no result after 3s") if (api, r) == (broken, 1)
                     else _child(api, {"context": 2.0, "lazy": 8.0, "lazy_captured": 2.2}[api])]
                    for api, r in perf._parts(cell)]
        assert check(perf._merge_compare(children, backend, perf._parts(cell))), broken


def test_peers_row_times_the_eager_step_and_keeps_it_when_torch_compile_fails(monkeypatch):
    """A peers cell: eager PyTorch's step on the CPU, measured wall time, with the loss eager training gives
    after the same steps; torch.compile failing is said in ``compile_error`` and the eager figures stay."""
    import torch

    import model_zoo
    from harness.runner import disable_dropout

    def no_compiler(model, *args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(torch, "compile", no_compiler)
    cell = {"report": "mlp-width", "kind": "peers", "model": "mlp_w64", "config": "tiny",
            "backend": PEER_BACKEND, "steps": 3, "warmup": 2}
    (row,) = perf.run_cell(cell)
    assert row.status == "ok" and row.time_kind == perf.MEASURED and row.backend == PEER_BACKEND
    assert row.compile_error == "compile: RuntimeError: no C++ compiler" and row.compile.step_ms is None
    # exact on purpose: a median of floats never leaves their [min, max]
    assert 0 < row.eager.step_ms_min <= row.eager.step_ms <= row.eager.step_ms_max
    spec = model_zoo.get("mlp_w64")
    model = disable_dropout(spec.build("tiny", seed=0))
    opt = spec.optimizer(model.parameters())
    for batch in perf._batches(spec, "tiny", 5, 0) + perf._batches(spec, "tiny", 5, 0)[:1]:
        loss = model_zoo.train_step(spec, model, opt, batch)
    assert row.eager.loss == pytest.approx(float(loss.detach()), rel=1e-6)  # 5 steps over the 4 batches, cycled


def test_peers_table_puts_each_backend_captured_step_over_eager():
    peers = PerfRow(report="models", model="gpt2_small", config="default", backend=PEER_BACKEND, device="cpu",
                    sim_mode=None, steps=3, warmup=3, status="ok", reason="", time_kind=perf.MEASURED, batch=2,
                    eager=Measurement(step_ms=40.0), compile=Measurement(step_ms=20.0, warmup_compile_s=30.0))
    mine = PerfRow.from_json(_compare_row("models", "gpt2_small", "pfvm:cpu", 2.0, 4.0, 3.0, 1.0), "test")
    mine.lazy_captured = Measurement(step_ms=10.0)
    df = pd.DataFrame([peers.to_json(), mine.to_json()])
    rest, peer_rows = split_peers(df)
    assert list(rest["backend"]) == ["pfvm:cpu"] and list(peer_rows["backend"]) == [PEER_BACKEND]
    (r,) = tables.peers_table(peer_rows, rest).to_dict("records")
    assert (r["eager ms/step"], r["torch.compile ms/step"], r["pfvm:cpu: captured/eager"]) == ("40.0", "20.0", "0.25")
    assert list(tables.models_table(rest)["backend"]) == ["pfvm:cpu"]  # peers are not rows of mncore's tables


def test_simulated_board_rows_say_modelled(tmp_path, monkeypatch):
    """mncore2:auto in performance mode: device time is the modelled one, host time is measured."""
    monkeypatch.setenv("MNCORE_RUNTIME_DIR", str(tmp_path))  # a private board lock, whatever else runs
    monkeypatch.setenv("MNCORE_SIM_MODE", "functional")  # restored after the test (init_backend sets it)
    (row,) = perf.run_cell({"report": "mlp-width", "kind": "compare", "model": "mlp_w64", "config": "tiny",
                            "backend": "mncore2:auto", "sim_mode": "performance", "steps": 3, "warmup": 1})
    assert row.status == "ok", row.reason
    assert row.time_kind == perf.MODELLED and row.backend == "mncore2:auto (performance)"
    assert row.lazy.sim_mode_effective == row.context.sim_mode_effective == "performance"
    assert "warning" not in row.to_json()
    assert row.lazy.device_ms == pytest.approx(row.lazy.modelled_device_ms, rel=1e-6)
    # the worker is held at least the modelled time. Spans are differences of perf_counter() timestamps, whose
    # rounding grows with the machine's uptime (a few ns after months), so allow 10 ns per step, far below any real
    # shortfall (the modelled step here is ~0.1 ms)
    assert row.lazy.device_span_ms >= row.lazy.device_ms - 1e-5 and row.lazy.device_ms > 0
    assert row.ratio == pytest.approx(row.lazy.step_ms / row.context.step_ms)


def test_cli_measures_in_child_processes(tmp_path):
    """The real path: one child per cell, results files first, then the report."""
    assert cli.main(["report", "mlp-width", "--widths", "64", "--steps", "2", "--warmup", "1", "--config", "tiny",
                     "--backend", "pfvm:cpu,pfvm:tpu", "--rounds", "1", "--out", str(tmp_path)]) == 0
    meta, df = load(tmp_path / "mlp-width")
    assert set(df["status"]) == {"ok", "unavailable"} and meta["steps"] == 2 and meta["commit"]
    assert (tmp_path / "mlp-width" / "mlp_width_ratio.png").exists()
    # a backend that does not initialise costs one child, not one per API
    assert len(list((tmp_path / "mlp-width" / "cells").glob("*_pfvm_tpu_*.json"))) == 1
    assert len(list((tmp_path / "mlp-width" / "cells").glob("*_pfvm_cpu_*.json"))) == len(perf.APIS)
    # the peers cell (once per model, whatever the backends): eager measured; torch.compile measured unless
    # this machine cannot compile (then the row says why)
    (peer,) = df[df["backend"] == PEER_BACKEND].to_dict("records")
    assert peer["status"] == "ok" and peer["eager_step_ms"] > 0
    assert peer["compile_step_ms"] > 0 or isinstance(peer.get("compile_error"), str)
    assert "Peers: eager PyTorch and torch.compile" in (tmp_path / "mlp-width" / "report.md").read_text()


def test_cli_rounds_run_each_api_in_each_round_and_keep_the_median(tmp_path):
    """``--rounds 2``: each API's child runs twice; the row keeps both rounds' median steps, and its own
    figures are one of them (the lower, for two rounds)."""
    assert cli.main(["report", "mlp-width", "--widths", "64", "--steps", "3", "--warmup", "1", "--config", "tiny",
                     "--backend", "pfvm:cpu", "--rounds", "2", "--no-peers", "--out", str(tmp_path)]) == 0
    meta, df = load(tmp_path / "mlp-width")
    assert meta["rounds"] == 2 and len(list((tmp_path / "mlp-width" / "cells").glob("*_r[12].json"))) == 6
    (row,) = df.to_dict("records")
    assert row["status"] == "ok" and row["rounds"] == 2
    for api in perf.APIS:
        rounds = row[f"{api}_round_step_ms"]
        assert len(rounds) == 2 and row[f"{api}_step_ms"] == min(rounds), api


def test_results_with_undeclared_or_missing_fields_fail_naming_the_file(tmp_path):
    from reports.schema import SchemaError

    good = _unavailable("mlp-width", "mlp_w64")
    d = tmp_path / "mlp-width"
    d.mkdir()
    (d / "results.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, "lazy_step_mss": 1.0}) + "\n")
    with pytest.raises(SchemaError, match=r"results\.jsonl:2: unknown field\(s\) 'lazy_step_mss'"):
        load(d)
    (d / "results.jsonl").write_text(json.dumps({k: v for k, v in good.items() if k != "status"}) + "\n")
    with pytest.raises(SchemaError, match=r"results\.jsonl:1: missing field\(s\) 'status'"):
        load(d)


def test_rows_round_trip_through_their_schema():
    row = PerfRow.from_json(_compare_row("models", "resnet18", "pfvm:cpu", 3000.0, 3100.0, 300.0, 2900.0), "test")
    # exact on purpose: these are the input values read back through the schema, nothing is computed
    assert row.lazy.step_ms == 3100.0 and row.context.trace_ms == 0.0 and row.window.trace_ms == 300.0
    assert PerfRow.from_json(row.to_json(), "again") == row
    assert "traceback" not in row.csv_record()


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def test_publish_refuses_a_foreign_directory(tmp_path, monkeypatch, capsys):
    """A non-empty --publish DIR without a manifest is someone else's: refused, every file left alone."""
    src, pub = tmp_path / "src", tmp_path / "pub"
    _synthetic(src)
    _forbid_running(monkeypatch)
    pub.mkdir()
    (pub / "notes.txt").write_text("mine")
    assert cli.main(["report", "all", "--from", str(src), "--out", str(tmp_path / "dst"), "--publish", str(pub)]) == 2
    assert "has no harness-manifest.json" in capsys.readouterr().err
    assert _files(pub) == {"notes.txt"} and not (tmp_path / "dst").exists()


def test_publish_replaces_only_the_files_of_its_manifest(tmp_path, monkeypatch):
    src, pub = tmp_path / "src", tmp_path / "pub"
    _synthetic(src)
    _forbid_running(monkeypatch)
    assert cli.main(["report", "all", "--from", str(src), "--out", str(tmp_path / "a"), "--publish", str(pub)]) == 0
    first = json.loads((pub / page.MANIFEST).read_text())["files"]
    assert set(first) == _files(pub) - {page.MANIFEST} and "async/report.md" in first
    (pub / "README.txt").write_text("not the harness's")
    only_models = tmp_path / "only_models"
    page.adopt(src / "models", only_models / "models")
    assert cli.main(["report", "all", "--from", str(only_models), "--publish", str(pub)]) == 0
    second = json.loads((pub / page.MANIFEST).read_text())["files"]
    assert not any(f.startswith(("async/", "mlp-width/")) for f in second) and "models/report.md" in second
    assert _files(pub) == set(second) | {page.MANIFEST, "README.txt"}  # old files gone, the foreign one kept
    # a file the manifest does not list is never replaced
    (pub / page.MANIFEST).write_text(json.dumps({"files": []}))
    with pytest.raises(page.PublishError, match="index.html exists and was not written by harness report"):
        page.publish(only_models, pub)


def test_publish_refuses_an_empty_report(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "results.jsonl").write_text("")
    with pytest.raises(page.PublishError, match="nothing to publish"):
        page.publish(tmp_path, tmp_path / "pub")
    assert not (tmp_path / "pub").exists()


def test_committed_published_directory_has_its_manifest():
    """``make report`` republishes reports/published: its manifest must list exactly what is there."""
    pub = Path(__file__).resolve().parents[1] / "reports" / "published"
    assert set(json.loads((pub / page.MANIFEST).read_text())["files"]) == _files(pub) - {page.MANIFEST}


def _tiny(root: Path) -> None:
    """The synthetic results as a ``--config tiny`` run writes them (workloads say what ran)."""
    _synthetic(root)
    for name in ("mlp-width", "async", "models"):
        d = root / name
        rows = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines()]
        for r in rows:
            r["config"] = "tiny"
            if r["status"] == "ok":
                r["workload"] = f"`{r['model']}` config `tiny` (12,345 parameters; batch input_ids 2×16; AdamW)"
        _write(rows, d, {**META, "report": name, "config": "tiny"})


def test_tiny_config_report_says_what_ran_and_does_not_compare_with_the_article(tmp_path, monkeypatch):
    _tiny(tmp_path)
    _forbid_running(monkeypatch)
    assert cli.main(["report", "all", "--from", str(tmp_path)]) == 0
    index = (tmp_path / "index.md").read_text()
    assert "`gpt2_small` config `tiny` (12,345 parameters; batch input_ids 2×16; AdamW)" in index
    for claim in ("124M", "sequence 128", "GPT-2 small on the CUDA backend", "639 ms", "article lazy/Context",
                  tables.ASYNC_ARTICLE, "1.10 times"):
        assert claim not in index, claim
    assert "this run used config `tiny`, so they are not compared here" in index
    # the default config (the article's workloads) does compare
    _synthetic(tmp_path / "default")
    assert cli.main(["report", "all", "--from", str(tmp_path / "default")]) == 0
    index = (tmp_path / "default" / "index.md").read_text()
    assert "639 ms / 166 ms / 74%" in index and "| article lazy/Context |" in index and "1.10 times" in index


def test_page_renders_every_character_and_states_provenance_once(tmp_path, monkeypatch):
    """No character the plots' font lacks (matplotlib warns of missing glyphs: an error here), nothing
    outside Latin/punctuation/math on the page (no CJK that a machine without the font shows as boxes),
    no literal backticks in the HTML, and the provenance every report shares stated once."""
    import unicodedata
    import warnings

    _synthetic(tmp_path)
    _forbid_running(monkeypatch)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*[Gg]lyph.*missing.*")
        assert cli.main(["report", "all", "--from", str(tmp_path)]) == 0
    html_text = (tmp_path / "index.html").read_text()
    body = html_text.split("<body>", 1)[1]
    assert "`" not in body and "<code>harness report all --from DIR</code>" in body
    odd = {c for c in html_text + (tmp_path / "index.md").read_text()
           if ord(c) > 0x2FFF or unicodedata.east_asian_width(c) in ("W", "F")}
    assert not odd, odd
    index = (tmp_path / "index.md").read_text()
    assert index.count("abc1234") == 1 and index.count("9.9.9-test") == 1  # commit, torch: once
    assert index.count("## Provenance (every report)") == 1
    assert (tmp_path / "models" / "report.md").read_text().count("abc1234") == 1  # a report alone keeps its own


def _overlaps(fig) -> list[tuple[str, str]]:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [t for ax in fig.axes for t in ax.texts if t.get_visible() and t.get_text()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_mlp_plot_labels_never_overlap_and_breakdown_fonts_are_readable(tmp_path):
    import matplotlib.pyplot as plt

    from reports import plots

    rows = []
    for backend, kind, ratios in (("pfvm:cpu", perf.MEASURED, (3.8, 1.4, 0.97)),
                                  ("mncore2:auto (performance)", perf.MODELLED, (10.1, 7.7, 1.27)),
                                  ("emu2", perf.MODELLED, (3.9, 1.4, 1.0))):  # near-equal values at each width
        for w, r in zip((64, 512, 4096), ratios):
            rows.append(_compare_row("mlp-width", f"mlp_w{w}", backend, 1.0, r, 0.5, 0.5, kind=kind, width=w))
    df = pd.DataFrame(rows)
    fig = plots.mlp_figure(df)
    assert len([t for t in fig.axes[0].texts]) == 9
    assert _overlaps(fig) == []
    plt.close(fig)
    models = pd.DataFrame([_compare_row("models", m, b, 10.0, 12.0, 3.0, 9.0) for m in ("resnet18", "gpt2_small")
                           for b in ("pfvm:cpu", "mncore2:auto (performance)")])
    fig = plots.breakdown_figure(models)
    width, _ = fig.get_size_inches()
    sizes = [t.get_fontsize() for ax in fig.axes for t in [ax.title, ax.xaxis.label, ax.yaxis.label,
                                                           *ax.get_xticklabels(), *ax.get_yticklabels()] if t.get_text()]
    # shown at most 1200 px wide (the page's width): every text at 9 pt x 110 dpi x scale >= 11 px
    scale = min(1.0, 1200 / (width * 110))
    assert sizes and min(sizes) * 110 / 72 * scale >= 11, (min(sizes), width)
    plt.close(fig)


def test_from_on_the_committed_published_copy_renders_the_full_page(tmp_path, monkeypatch):
    """``reports/published`` holds what its page is made of: ``--from`` on a copy renders every report,
    with the same tables as the committed page, and runs nothing."""
    import shutil

    pub = Path(__file__).resolve().parents[1] / "reports" / "published"
    shutil.copytree(pub, tmp_path / "pub")
    _forbid_running(monkeypatch)
    assert cli.main(["report", "all", "--from", str(tmp_path / "pub"), "--out", str(tmp_path / "page")]) == 0
    index = (tmp_path / "page" / "index.md").read_text()
    for name in ("mlp-width", "async", "models"):
        assert page.TITLES[name] in index, name
        committed = tables.to_markdown({"mlp-width": tables.mlp_table, "async": tables.async_table,
                                        "models": tables.models_table}[name](split_peers(load(pub / name)[1])[0]))
        assert committed.count("\n") >= 2 and committed in index, name  # a table with rows, as published
    assert "mlp-width/mlp_width_ratio.png" in index and "models/models_breakdown.png" in index
    for png in (pub / "async").glob("timeline_*.png"):  # drawn again from timeline files, or kept and said so
        assert f"async/{png.name}" in index and (tmp_path / "page" / "async" / png.name).exists()


def test_workload_text_says_what_the_config_trains():
    """The report text's workload: parameters counted from the built model, the batch's shapes, the optimizer."""
    import model_zoo

    spec = model_zoo.get("mlp_w64")
    params = 4 * (64 * 64 + 64) + 64 * 10 + 10  # 4 x Linear(64, 64) + Linear(64, 10)
    assert sum(p.numel() for p in spec.build("default").parameters()) == params
    assert perf.workload(spec, "default") == f"`mlp_w64` config `default` ({params:,} parameters; batch x 64×64, y 64; SGD)"


def test_targets_are_the_stated_ones_per_backend_with_the_worst_width_and_eager_as_reference():
    """Issues 12 and 13 state their limits per backend: lazy/Context at w=64 is ≤ 3.0 on pfvm:cpu but ≤ 4.0
    on mncore2; captured/Context ≤ 1.10 at every width (judged at the worst); pfvm:cpu's captured step at
    w=64 against eager PyTorch's own, measured as a peers row of the same run; the models' capture targets
    on mncore2 only."""
    mn = tables.MNCORE2
    rows = [_compare_row("mlp-width", "mlp_w64", "pfvm:cpu", 1.0, 2.9, 2.0, 0.8, width=64, captured_ms=1.05),
            _compare_row("mlp-width", "mlp_w4096", "pfvm:cpu", 400.0, 430.0, 4.0, 399.0, width=4096, captured_ms=444.0),
            _compare_row("mlp-width", "mlp_w64", mn, 1.0, 3.5, 2.0, 0.1, width=64, captured_ms=1.09),
            _compare_row("mlp-width", "mlp_w4096", mn, 400.0, 410.0, 4.0, 400.0, width=4096, captured_ms=400.0),
            {"report": "mlp-width", "model": "mlp_w64", "backend": PEER_BACKEND, "width": 64, "status": "ok",
             "eager_step_ms": 1.0}]
    got = {(t.backend, t.what): t for t in tables.targets("mlp-width", pd.DataFrame(rows))}
    verdicts = {k: t.verdict for k, t in got.items()}
    assert verdicts == {
        ("pfvm:cpu", "lazy/Context at w=4096"): "NOT met",  # 1.075
        ("pfvm:cpu", "lazy/Context at w=64"): "met",  # 2.9 <= 3.0
        (mn, "lazy/Context at w=4096"): "met",  # 1.025
        (mn, "lazy/Context at w=64"): "met",  # 3.5 <= 4.0 (it would fail pfvm:cpu's 3.0)
        ("pfvm:cpu", "captured/Context at every width"): "NOT met",  # w=4096: 1.11
        (mn, "captured/Context at every width"): "met",  # worst 1.09 at w=64
        ("pfvm:cpu", "captured step at w=64 / eager PyTorch's"): "NOT met",  # 1.05 ms vs 1.0 ms
    }
    assert got[("pfvm:cpu", "captured/Context at every width")].value == "1.110 (worst: w=4096 of 2)"
    models = [_compare_row("models", "gpt2_small", mn, 40.0, 160.0, 120.0, 37.0, captured_ms=43.0),
              _compare_row("models", "resnet18", mn, 100.0, 120.0, 20.0, 99.0, captured_ms=106.0),
              _compare_row("models", "gpt2_small", "pfvm:cpu", 40.0, 160.0, 120.0, 37.0, captured_ms=80.0)]
    models[0]["lazy_captured_trace_ms"] = 1.5
    got = {(t.backend, t.what): t.verdict for t in tables.targets("models", pd.DataFrame(models))}
    assert got == {(mn, "gpt2_small captured/Context"): "met", (mn, "resnet18 captured/Context"): "NOT met",
                   (mn, "gpt2_small host time per captured step"): "met"}


def test_a_verdict_whose_rounds_straddle_its_limit_says_so():
    """Rows timed in rounds: a target whose rounds' ratios (round i over the Context step of round i) fall
    on both sides of its limit keeps the median's verdict and says that one round would have flipped it;
    rounds clear of the limit, or a row timed once, add nothing."""
    mn = tables.MNCORE2
    straddling = _compare_row("mlp-width", "mlp_w64", mn, 1.0, 3.5, 2.0, 0.1, width=64, captured_ms=1.08)
    straddling.update(context_round_step_ms=[1.0, 1.0, 1.0], lazy_round_step_ms=[3.4, 3.5, 3.6],
                      lazy_captured_round_step_ms=[1.05, 1.08, 1.2])
    clear = _compare_row("mlp-width", "mlp_w4096", mn, 400.0, 400.0, 4.0, 400.0, width=4096, captured_ms=400.0)
    clear.update(context_round_step_ms=[400.0, 410.0], lazy_captured_round_step_ms=[400.0, 410.0])
    once = _compare_row("mlp-width", "mlp_w64", "pfvm:cpu", 1.0, 2.9, 2.0, 0.8, width=64, captured_ms=1.05)
    got = {(t.backend, t.what): t for t in tables.targets("mlp-width", pd.DataFrame([straddling, clear, once]))}
    captured = got[(mn, "captured/Context at every width")]
    assert captured.verdict == "met" and captured.note == (
        "rounds at w=64 1.05–1.20 fall on both sides of the limit: the verdict is the median's, not a clear margin")
    wider = {**clear, "context_round_step_ms": [400.0, 400.0], "lazy_captured_round_step_ms": [380.0, 460.0]}
    got = {(t.backend, t.what): t for t in tables.targets("mlp-width", pd.DataFrame([straddling, wider]))}
    assert got[(mn, "captured/Context at every width")].note.startswith(
        "rounds at w=64 1.05–1.20, at w=4096 0.95–1.15 fall on both sides")
    assert got[(mn, "lazy/Context at w=64")].note == ""  # 3.4–3.6, all under 4.0
    assert got[(mn, "lazy/Context at w=4096")].note == "" and got[("pfvm:cpu", "lazy/Context at w=64")].note == ""
    assert tables.round_ratios(pd.Series(clear), "lazy_captured") == pytest.approx([1.0, 1.0])


def test_provenance_states_rounds_only_where_there_were_several():
    """A report timed in rounds says how many; one timed once, or a results file without the field (the
    async report, an earlier run), or one where it was written empty, renders without it."""
    df = pd.DataFrame([_compare_row("mlp-width", "mlp_w64", "pfvm:cpu", 1.0, 2.0, 1.0, 0.5, width=64)])
    for meta, shown in (({**META, "rounds": 3}, True), (META, False), ({**META, "rounds": None}, False),
                        ({**META, "rounds": 1}, False)):
        rows = dict(page.provenance(meta, df).values.tolist())
        assert ("rounds" in rows) is shown, meta.get("rounds")
        if shown:
            assert rows["rounds"].startswith("3: each API timed in that many child processes")
