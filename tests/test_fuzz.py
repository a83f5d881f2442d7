"""``harness fuzz``: injected backend bugs are found, shrunk and reproduced; clean runs pass and replay.

The test backends are plugin modules under ``tests/fuzz_plugins`` that replace an aten op's
lowering with ``mncore.register_lowering`` (the campaign imports them in its worker), so
every verdict here is still mncore against eager PyTorch on CPU. Campaigns run through the real
command line in a subprocess, with case budgets so that they are deterministic.
"""
from __future__ import annotations

import ctypes.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.fuzz.campaign import Config, plan, select_rows
from harness.fuzz.cases import Case
from harness.fuzz.mutate import generate
from harness.fuzz.oracles import run_case
from harness.opgen import resolve_op
from harness.registry_cmd import DEFAULT_PATH
from mncore import register_lowering, unregister_lowering
from shape_registry import Registry

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def _start(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", "fuzz", "--out", str(out), *args], cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen, out: Path, timeout: float = 180) -> tuple[subprocess.CompletedProcess, dict]:
    stdout, stderr = proc.communicate(timeout=timeout)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert (out / "summary.json").exists(), f"no summary (exit {proc.returncode}):\n{stderr[-3000:]}"
    return done, json.loads((out / "summary.json").read_text())


def _fuzz(out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run ``harness fuzz`` through the real command line; returns the process and its summary."""
    return _finish(_start(out, *args), out)


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


# The off-by-one sum plugin's bug when the element it drops is an inf of the registry's value ranges.
_SUM_NONFINITE = "aten.sum.dim_IntList:nonfinite_mismatch:lazy_vs_eager"


def test_wrong_lowering_is_found_shrunk_and_reproduced(tmp_path: Path) -> None:
    """An off-by-one ``sum.dim_IntList`` lowering: found within 25 cases, shrunk, and its repro fails only with it."""
    # The case budget decides (a time budget far beyond it), so the verdicts do not depend on machine speed.
    proc, s = _fuzz(tmp_path, "--seconds", "600", "--cases", "25", "--seed", "3", "--ops", "aten.sum.dim_IntList",
                    "--plugin", "tests.fuzz_plugins.off_by_one")
    sig = "aten.sum.dim_IntList:mismatch:lazy_vs_eager"
    assert proc.returncode == 1, proc.stderr[-3000:]  # findings make the command fail
    # The same bug may also show as a non-finite mismatch (see _SUM_NONFINITE); nothing else may be found.
    assert sig in s["failures"], s["failures"]
    assert set(s["failures"]) <= {sig, _SUM_NONFINITE}, s["failures"]
    assert s["cases_run"] == 25 and s["plugin"] == "tests.fuzz_plugins.off_by_one"
    f = s["failures"][sig]
    first = next(r for r in _results(tmp_path) if r["signature"] == sig)
    assert first["index"] == f["first_case"] and first["oracle"] == "lazy_vs_eager"

    # Shrunk: no size measure grew, the input got smaller, and the reduced dim still has > 2 elements.
    assert all(a <= b for a, b in zip(f["shrunk_size"], f["original_size"])), f
    assert f["shrunk_numel"] < f["original_numel"], f
    record = json.loads((tmp_path / "findings" / "aten.sum.dim_IntList__mismatch__lazy_vs_eager.json").read_text())
    shrunk = Case.from_json(record["shrunk_case"])
    assert shrunk.numel() == f["shrunk_numel"] <= 8
    x, dims = shrunk.build_inputs()[0][:2]
    assert x.shape[dims[0] % x.dim()] > 2
    # The shrunk case alone still fails against eager (the plugin lowers sum without its last element).
    assert record["plugin"] == "tests.fuzz_plugins.off_by_one" and record["kind"] == "mismatch"

    script = Path(f["repro"])
    assert script.parent == tmp_path / "findings" and script.with_suffix(".pt").exists()
    runs = {flag: subprocess.Popen([sys.executable, str(script), *flag], cwd=tmp_path, env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for flag in ((), ("--no-plugin",))}
    out = {flag: (p.wait(timeout=120), p.stdout.read(), p.stderr.read()) for flag, p in runs.items()}
    code, _, err = out[()]
    assert code != 0 and "mncore disagrees with eager" in err, err[-2000:]
    code, stdout, err = out[("--no-plugin",)]
    assert code == 0 and "mncore agrees with eager" in stdout, err[-2000:]


def test_clean_campaign_finds_nothing_and_replays_from_seed(tmp_path: Path) -> None:
    """Correct ops pass every oracle; the same seed and case budget run the same cases with the same verdicts."""
    ops = "aten.add.Tensor,aten.mm.default,aten.sigmoid.default"
    args = ("--seconds", "600", "--cases", "12", "--seed", "7", "--ops", ops)  # the case budget decides
    runs = [(_start(tmp_path / d, *args), tmp_path / d) for d in ("a", "b")]  # side by side: 2 cores
    (proc_a, a), (proc_b, b) = (_finish(p, out) for p, out in runs)
    assert proc_a.returncode == 0, proc_a.stderr[-3000:]
    assert a["failures"] == {} and a["flaky"] == {} and a["cases_run"] == 12
    assert a["outcomes"].get("pass", 0) + a["outcomes"].get("skip", 0) == 12
    assert a["checks"]["lazy_vs_eager"].get("pass", 0) > 0 and a["checks"]["context_vs_lazy"].get("pass", 0) > 0
    assert a["checks"]["grad_vs_eager"].get("pass", 0) > 0 and a["checks"]["captured_vs_lazy"].get("pass", 0) > 0
    assert set(a["ops_covered"]) <= set(ops.split(",")) and a["n_ops_covered"] >= 2

    ra, rb = _results(tmp_path / "a"), _results(tmp_path / "b")
    assert [r["case"] for r in ra] == [r["case"] for r in rb]
    assert [(r["status"], r["category"], r["checks"]) for r in ra] == [(r["status"], r["category"], r["checks"]) for r in rb]
    cfg = Config(seed=7, ops=ops)
    assert [c.to_json() for c in plan(cfg, 12)] == [r["case"] for r in ra]  # the plan, not the timing, decides
    assert [c.to_json() for c in plan(Config(seed=8, ops=ops), 12)] != [r["case"] for r in ra]


def _row(op: str) -> Case:
    rows = [e for e in Registry.load(DEFAULT_PATH).query(op) if e.op == op]
    return Case.from_entry(min(rows, key=lambda e: sum(torch.Size(t["shape"]).numel() for t in e.tensors())))


@pytest.fixture(scope="module")
def invalid_cases() -> dict[str, Case]:
    mm = _row("aten.mm.default")
    emb = _row("aten.embedding.default")
    return {
        "mm_inner_dim": mm.with_mutation({"kind": "resize", "arg": "a1", "dim": 0,
                                          "to": mm.entry().args[1]["shape"][0] + 1, "by": "fuzz"}),
        "embedding_index_oob": emb.with_mutation({"kind": "index_oob", "arg": "a1", "by": "fuzz"}),
        # a table of no rows: no index is valid (the generator drew them from an empty range and gave up)
        "embedding_no_rows": emb.with_mutation({"kind": "resize", "arg": "a0", "dim": 0, "to": 0, "by": "fuzz"}),
    }


@pytest.mark.parametrize("name", ["mm_inner_dim", "embedding_index_oob", "embedding_no_rows"])
def test_invalid_inputs_mncore_raising_like_eager_pass(invalid_cases: dict, name: str) -> None:
    """Eager raises on these inputs; mncore raising a Python exception too is a pass, not a finding."""
    case = invalid_cases[name]
    args, kwargs = case.build_inputs()
    op = resolve_op(case.op)
    with pytest.raises((RuntimeError, IndexError)):
        op(*args, **kwargs)  # the reference itself rejects them
    res = run_case(case, context=None, codegen_dir="")
    assert (res["status"], res["category"]) == ("pass", "invalid"), res
    assert res["eager_error"] and res["mncore_error"]


def test_indices_into_a_dimension_shrunk_below_their_recorded_range_stay_within_it(tmp_path: Path) -> None:
    """A mutation that shrinks the dimension an index tensor indexes below the indices the row recorded (26
    into 32 rows, then 4 rows) draws them within the new size: a valid case, checked against eager (the
    generator drew from an empty range and the case never ran)."""
    sel = _row("aten.index_select.default")
    assert sel.entry().args[2]["range"][0] >= 4  # the recorded index lies past the shrunk dimension
    case = sel.with_mutation({"kind": "resize", "arg": "a0", "dim": 0, "to": 4, "by": "fuzz"})
    args, _ = case.build_inputs()
    assert args[0].shape[0] == 4 and 0 <= int(args[2].min()) and int(args[2].max()) < 4
    res = run_case(case, context=_context(), codegen_dir=str(tmp_path))
    assert (res["status"], res["category"], res["checks"]["lazy_vs_eager"], res["checks"]["context_vs_lazy"]) == (
        "pass", "valid", "pass", "pass"), res


def test_invalid_input_accepted_by_mncore_is_a_finding(invalid_cases: dict) -> None:
    """The same oracle fails when mncore returns a result for inputs eager rejects (a clamping lowering)."""
    emb = torch.ops.aten.embedding.default
    register_lowering(emb, lambda w, idx, *a: torch.ops.aten.embedding.default(w, idx.clamp(0, w.shape[0] - 1), *a))
    try:
        res = run_case(invalid_cases["embedding_index_oob"], context=None, codegen_dir="")
    finally:
        unregister_lowering(emb)
    assert (res["status"], res["kind"], res["oracle"]) == ("fail", "accepts_invalid", "lazy_vs_eager"), res


def test_crash_and_hang_are_recorded_not_propagated(tmp_path: Path) -> None:
    """A lowering that kills the worker and one that never returns become findings; the campaign goes on."""
    ops = "aten.neg.default,aten.relu.default,aten.sigmoid.default"
    n = 6
    rows = select_rows(Config(ops=ops))
    seed = next(s for s in range(100) if {generate(rows, s, i, 1 << 16).op for i in range(n)} == set(ops.split(",")))
    proc, s = _fuzz(tmp_path, "--seconds", "600", "--cases", str(n), "--seed", str(seed), "--ops", ops,
                    "--plugin", "tests.fuzz_plugins.crash_hang", "--case-timeout", "2", "--shrink-seconds", "0")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert s["cases_run"] == n and len(_results(tmp_path)) == n
    assert set(s["failures"]) == {"aten.neg.default:crash:lazy_vs_eager", "aten.relu.default:hang:lazy_vs_eager"}
    assert "exit code 3" in s["failures"]["aten.neg.default:crash:lazy_vs_eager"]["message"]
    assert "no answer within" in s["failures"]["aten.relu.default:hang:lazy_vs_eager"]["message"]
    sigmoid = [r for r in _results(tmp_path) if r["op"] == "aten.sigmoid.default"]
    assert sigmoid and all(r["status"] in ("pass", "skip") for r in sigmoid)  # fresh workers after each crash/hang
    assert s["worker_starts"] > 2


def test_repro_templates_pass_on_a_correct_backend(tmp_path: Path) -> None:
    """The Context, gradient, crash/hang and output repro forms run eager and mncore and pass when mncore is
    right, for ops of torchvision's namespace too; a ``lazy_alone`` crash's script passes when mncore refuses, and a
    ``captured_vs_lazy`` mismatch's when capture refuses the step (it is traced on every call then)."""
    from harness.fuzz.findings import Findings

    case = _row("aten.mul.Tensor").with_mutation({"kind": "layout", "arg": "a0", "layout": "strided", "by": "fuzz"})
    meta = {"command": "harness fuzz (test)", "backend": "pfvm:cpu", "plugin": None, "case_timeout": 30.0}
    findings = Findings(tmp_path)
    forms = {("mismatch", "context_vs_lazy"): "Context API agrees with lazy mode",
             ("mismatch", "captured_vs_lazy"): "the captured step agrees with lazy mode",
             ("crash", "captured_vs_lazy"): "mncore completed the step",
             ("mismatch", "grad_vs_eager"): "mncore gradients agree with eager",
             ("crash", "lazy_vs_eager"): "mncore completed the step"}
    scripts = {form: findings.write(f"{case.op}:{form[0]}:{form[1]}", case, case, {"kind": form[0], "oracle": form[1]},
                                    {}, meta) for form in forms}
    roi = _row("torchvision.roi_align.default")  # its op exists once torchvision is imported (found: it was not)
    forms["torchvision"] = "mncore agrees with eager"
    scripts["torchvision"] = findings.write(f"{roi.op}:mismatch:lazy_vs_eager", roi, roi,
                                            {"kind": "mismatch", "oracle": "lazy_vs_eager"}, {}, meta)
    # mncore alone where eager's kernel dies: refusing the call (a Python exception) completes the step
    alone = Case.from_json(_WEIGHT_NORM_NO_SLICES)
    forms["alone"] = "mncore completed the step"
    scripts["alone"] = findings.write(f"{alone.op}:crash:lazy_alone", alone, alone,
                                      {"kind": "crash", "oracle": "lazy_alone"}, {}, meta)
    # a captured_vs_lazy finding that capture refuses now (a step that transposes its argument) passes
    refused = _filled_row("aten.transpose_.default")
    forms["refused"] = "the captured step is traced on every call"
    scripts["refused"] = findings.write(f"{refused.op}:mismatch:captured_vs_lazy", refused, refused,
                                        {"kind": "mismatch", "oracle": "captured_vs_lazy"}, {}, meta)
    # One interpreter runs the scripts in turn (each import of torch + mncore costs seconds).
    runner = "import runpy, sys\nfor p in sys.argv[1:]:\n    runpy.run_path(p, run_name='__main__')\n"
    proc = subprocess.run([sys.executable, "-c", runner, *map(str, scripts.values())], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line for line in proc.stdout.splitlines() if line in forms.values()] == list(forms.values())


def test_resume_continues_a_campaign_and_keeps_its_results(tmp_path: Path) -> None:
    """``--resume DIR`` runs the campaign's next cases (its own seed and ops) and appends; nothing is lost."""
    ops = "aten.add.Tensor,aten.sigmoid.default"
    first, _ = _fuzz(tmp_path, "--seconds", "600", "--cases", "3", "--seed", "5", "--ops", ops)
    assert first.returncode == 0, first.stderr[-3000:]
    again = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--resume", str(tmp_path), "--seconds", "600",
                            "--cases", "2", "--seed", "99"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = _results(tmp_path)
    assert [r["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["case"] for r in rows] == [c.to_json() for c in plan(Config(seed=5, ops=ops), 5)]  # seed 5, not 99
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["cases_run"] == 5 and sum(s["outcomes"].values()) == 5


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_local_campaign_stopped_by_a_signal_keeps_its_cases_and_resumes(tmp_path: Path, sig: int) -> None:
    """Ctrl-C (or SIGTERM) in the middle of a local campaign: the cases that ended stay in the results, the
    summary counts exactly those and names the signal, the exit status is the shell's 128 + signal, and
    ``--resume`` goes on with the next case."""
    ops = "aten.add.Tensor,aten.sigmoid.default"
    proc = _start(tmp_path, "--seconds", "600", "--cases", "100000", "--seed", "5", "--ops", ops)
    results = tmp_path / "results.jsonl"
    deadline = time.monotonic() + 120
    while not (results.exists() and len(results.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "the campaign ran no cases"
        time.sleep(0.2)
    proc.send_signal(sig)
    done, s = _finish(proc, tmp_path)
    assert done.returncode == 128 + sig, done.stderr[-3000:]
    assert s["interrupted"] == signal.Signals(sig).name and "--resume" in done.stderr
    rows = _results(tmp_path)
    assert s["cases_run"] == len(rows) == sum(s["outcomes"].values()) >= 3
    assert [r["index"] for r in rows] == list(range(len(rows)))
    again = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--resume", str(tmp_path), "--seconds", "600",
                            "--cases", "1"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [r["index"] for r in _results(tmp_path)] == list(range(len(rows) + 1))
    assert [r["case"] for r in _results(tmp_path)] == [c.to_json() for c in plan(Config(seed=5, ops=ops), len(rows) + 1)]


def test_default_out_is_a_fresh_directory_per_campaign(tmp_path: Path, monkeypatch) -> None:
    import argparse

    from harness.fuzz import campaign

    monkeypatch.setattr(campaign, "DEFAULT_ROOT", tmp_path)
    args = argparse.Namespace(out=None, resume=None)
    a, _ = campaign.campaign_dir(args)
    a.mkdir()
    b, _ = campaign.campaign_dir(args)
    assert a.parent == b.parent == tmp_path and a != b and not b.exists()


def test_baseline_lists_known_findings_and_new_ones_still_fail(tmp_path: Path) -> None:
    """The injected off-by-one ``sum``: listed in a baseline it is a known finding (counted, exit 0, not
    shrunk); with an entry whose ``match`` text its message lacks, or absent, it is new (exit 1)."""
    sig = "aten.sum.dim_IntList:mismatch:lazy_vs_eager"
    both = {sig, _SUM_NONFINITE}  # the plugin's one bug, under both signatures it can show
    listed, other = tmp_path / "listed.json", tmp_path / "other.json"
    listed.write_text(json.dumps({"entries": [{"signature": s, "reason": "injected by the test plugin"} for s in both]}))
    other.write_text(json.dumps({"entries": [{"signature": s, "match": "NotCompilableError", "reason": "x"}
                                             for s in both]}))
    args = ("--seconds", "600", "--cases", "25", "--seed", "3", "--ops", "aten.sum.dim_IntList",
            "--plugin", "tests.fuzz_plugins.off_by_one", "--shrink-seconds", "0")
    runs = [(_start(tmp_path / d, *args, "--baseline", str(b)), tmp_path / d) for d, b in (("a", listed), ("b", other))]
    (known, a), (new, b) = (_finish(p, out) for p, out in runs)
    assert known.returncode == 0, known.stderr[-3000:]
    assert a["failures"] == {} and sig in a["known"] and set(a["known"]) <= both
    assert all(k["reason"] == "injected by the test plugin" for k in a["known"].values())
    assert sum(k["count"] for k in a["known"].values()) == a["outcomes"]["known"] >= 1
    assert "known, not a bug: " + sig in known.stdout
    assert not (tmp_path / "a" / "findings").exists() or not any((tmp_path / "a" / "findings").iterdir())
    assert all(r["signature"] in both for r in _results(tmp_path / "a") if r["status"] == "known")
    assert new.returncode == 1 and sig in b["failures"] and set(b["failures"]) <= both and b["known"] == {}, \
        new.stderr[-3000:]
    assert f"NEW {sig}" in new.stdout and "add its signature and the reason to" in new.stderr


def test_committed_baseline_covers_todays_by_design_findings(tmp_path: Path) -> None:
    """Every entry of ci/fuzz_baseline.json has a signature and a reason; a layout-dependent failure of
    eager's own kernel is covered, another error of the same op is not; a broken file is refused."""
    from harness.fuzz import baseline

    entries = baseline.load()
    assert entries and all(e.reason and e.signature.count(":") == 2 for e in entries)
    sig = "aten.gelu_backward.default:error:lazy_vs_eager"
    assert baseline.lookup(entries, sig, "... RuntimeError: could not create a primitive descriptor for the reorder ...")
    assert baseline.lookup(entries, sig, "RuntimeError: something else") is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": [{"signature": sig}]}))
    with pytest.raises(baseline.BaselineError, match="entry 0 needs a 'signature'"):
        baseline.load(bad)
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "fuzz", "--out", str(tmp_path / "o"), "--cases", "1",
                           "--baseline", str(bad)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "--baseline" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_shards_deal_the_next_cases_round_robin() -> None:
    """``--jobs N`` shards: every next case exactly once (the gaps a lost shard left first), N at most."""
    from harness.fuzz.on_cluster import plan_shards
    from harness.fuzz.shard import indices

    assert [list(indices(s)) for s in plan_shards(set(), 5, 2)] == [[0, 2, 4], [1, 3]]
    assert [list(indices(s)) for s in plan_shards({0, 1, 3}, 3, 2)] == [[2, 5], [4]]  # gap 2, then 4 and 5
    assert [list(indices(s)) for s in plan_shards(set(), 1, 3)] == [[0]]  # no empty shard


class _FaultyCluster:
    """A local cluster whose first cell's node is lost before it runs and which is interrupted (SIGINT)
    once another cell has ended: what a Ray run reports for a dead node and for Ctrl-C."""

    def __init__(self) -> None:
        from harness.cluster import LocalCluster

        self.inner = LocalCluster(2)

    def outcomes(self, jobs, timeout):
        import signal

        from harness.cells import Outcome
        from harness.interrupt import Interrupted

        yield 0, Outcome(jobs[0], "node_lost", None, 1.0, "the Ray worker or node 127.0.0.9 died during the cell "
                         "(WorkerCrashedError)", "127.0.0.9")
        inner = self.inner.outcomes(jobs[1:], timeout)
        try:
            for i, outcome in inner:
                yield i + 1, outcome
                raise Interrupted(signal.SIGINT)
        finally:
            inner.close()  # what Ctrl-C does to a cluster's iterator: its other cells are ended


def test_campaign_on_a_cluster_reports_a_lost_node_and_keeps_what_ended_when_interrupted(tmp_path: Path) -> None:
    """Three shards: the first one's node is lost, one ends, then SIGINT. The summary names the lost
    node and its cases and the signal; the results hold the ended shard's cases; no shard process is
    left; ``--resume`` then runs exactly the missing cases (the same cases as a campaign never stopped)."""
    from harness.fuzz.campaign import Campaign
    from harness.fuzz.on_cluster import plan_shards
    from harness.fuzz.shard import indices

    ops = "aten.add.Tensor,aten.sigmoid.default"
    cfg = Config(seconds=600, cases=3, seed=5, ops=ops, out=tmp_path, jobs=3, cluster="faulty", progress=False)
    s = Campaign(cfg).run(_FaultyCluster())
    assert s["interrupted"] == "SIGINT"
    lost = [(x["cell"], x["status"], x["node"]) for x in s["lost"]]
    assert lost == [("round 1 shard 0", "node_lost", "127.0.0.9")]
    assert "0..2 step 3" in s["lost"][0]["what"] and "127.0.0.9" in s["lost"][0]["reason"]
    ran = sorted(r["index"] for r in _results(tmp_path))
    assert ran in [list(indices(spec)) for spec in plan_shards(set(), 3, 3)[1:]] and s["cases_run"] == len(ran)
    assert _shards_running() == []  # the interrupted shard's process was ended

    again = Config(seconds=600, cases=3 - len(ran), seed=5, ops=ops, out=tmp_path, resume=True, progress=False)
    s = Campaign(again).run()
    rows = sorted(_results(tmp_path), key=lambda r: r["index"])
    assert [r["case"] for r in rows] == [c.to_json() for c in plan(Config(seed=5, ops=ops), 3)]
    assert s["cases_run"] == 3 and s["failures"] == {}


def _shards_running() -> list[int]:
    """The live shard processes this process started (a local cluster's cells are its children)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            state, ppid = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if b"harness.fuzz.shard" in cmd and int(ppid) == os.getpid() and state != "Z":
            found.append(int(proc.name))
    return found


def test_fuzz_cluster_options_are_checked_before_anything_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    """``--jobs`` without a cluster, and ``ray://`` without Ray Client's grpcio, stop with the fix named."""
    import importlib.util

    from harness import cli, cluster

    out = tmp_path / "o"
    assert cli.main(["fuzz", "--cases", "1", "--jobs", "2", "--out", str(out)]) == 2
    assert "--cluster ray --jobs 2" in capsys.readouterr().err
    real = importlib.util.find_spec
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    assert cli.main(["fuzz", "--cases", "1", "--cluster", "ray://127.0.0.1:10001", "--out", str(out)]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(ctypes.util.find_library("c_malloc_debug") is None,
                    reason="glibc older than 2.34 has no checking allocator to preload (libc_malloc_debug.so.0)")
def test_malloc_check_crashes_the_case_that_writes_past_its_buffer(tmp_path: Path) -> None:
    """With ``--malloc-check`` a lowering that writes one byte past its output (nothing fails at once) is a
    crash of its own op, confirmed in a fresh worker, and its repro script crashes the same way."""
    proc, s = _fuzz(tmp_path, "--cases", "8", "--seed", "3", "--ops", "aten.mul.Tensor", "--malloc-check",
                    "--plugin", "tests.fuzz_plugins.overrun", "--shrink-seconds", "0")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert s["malloc_check"] and "--malloc-check" in s["command"]
    crash = s["failures"].get("aten.mul.Tensor:crash:lazy_vs_eager")
    assert crash and crash["repro"], s["failures"]
    assert "free(): invalid pointer" in crash["message"]  # glibc's check found the overwritten byte
    repro = subprocess.run([sys.executable, crash["repro"]], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert repro.returncode != 0 and "crash: the child exited" in repro.stderr, repro.stderr[-2000:]


def test_malloc_check_needs_glibcs_checking_allocator(tmp_path: Path, monkeypatch, capsys) -> None:
    """The checking allocator goes ahead of the user's LD_PRELOAD; where glibc has none, ``--malloc-check``
    stops before anything runs, naming the fix."""
    from harness import cli
    from harness.fuzz import heap_check

    monkeypatch.setenv("LD_PRELOAD", "libmine.so")
    monkeypatch.setattr(heap_check.ctypes.util, "find_library", lambda name: f"lib{name}.so.0")
    assert heap_check.environment() == {"LD_PRELOAD": "libc_malloc_debug.so.0 libmine.so", "MALLOC_CHECK_": "3",
                                        "LIBC_FATAL_STDERR_": "1"}
    monkeypatch.setattr(heap_check.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(heap_check, "_DIRS", ())  # nor in any directory
    out = tmp_path / "o"
    assert cli.main(["fuzz", "--cases", "1", "--malloc-check", "--out", str(out)]) == 2
    assert "glibc 2.34 or newer" in capsys.readouterr().err
    assert not out.exists()


def _context() -> Any:
    """A Context on pfvm:cpu, as the fuzz worker makes one."""
    import mncore
    from mncore.context import Context, MNDevice

    mncore.init("pfvm:cpu")
    ctx = Context(MNDevice("pfvm:cpu"))
    Context.switch_context(ctx)
    return ctx


def test_context_refusing_an_op_lazy_mode_runs_eagerly_is_not_a_finding(tmp_path: Path) -> None:
    """masked_select's output shape depends on its values: lazy mode runs it eagerly, the Context API
    (one static graph) refuses it with NotCompilableError, by design. The oracle records that as not
    applicable; before, every such op (ctc_loss, nms, fused optimizers, ...) was a new finding."""
    case = _row("aten.masked_select.default")
    res = run_case(case, context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "pass", res
    assert res["checks"]["context_vs_lazy"].startswith("n/a: output shape known only by running the op"), res
    assert res["checks"]["lazy_vs_eager"] == "pass", res


def test_context_oracle_passes_out_tensors_given_as_keywords(tmp_path: Path) -> None:
    """``maximum.out(a, b, out=o)`` through the Context oracle: keyword tensors reach the compiled function
    as tensors (they reached it as the oracle's placeholders, and every out= op failed the oracle)."""
    case = _row("aten.maximum.out")
    res = run_case(case, context=_context(), codegen_dir=str(tmp_path))
    assert (res["status"], res["checks"]["context_vs_lazy"]) == ("pass", "pass"), res


def _filled_row(op: str) -> Case:
    """The smallest registry row of ``op`` whose every tensor has 4 elements or more (values a replay of
    stale inputs would get wrong; the smallest rows are often empty)."""
    rows = [e for e in Registry.load(DEFAULT_PATH).query(op)
            if e.op == op and min(torch.Size(t["shape"]).numel() for t in e.tensors()) >= 4]
    return Case.from_entry(min(rows, key=lambda e: sum(torch.Size(t["shape"]).numel() for t in e.tensors())))


@pytest.mark.parametrize("op", ["aten.mul.Tensor", "aten.add_.Tensor", "aten.maximum.out", "aten.sort.default",
                                "aten.native_batch_norm.default", "aten._fused_sgd_.default"])
def test_capture_oracle_replays_the_op_on_the_cases_own_inputs(tmp_path: Path, op: str) -> None:
    """Outputs, arguments written in place (``add_``, an ``out=`` tensor, batch norm's running statistics, a fused
    optimizer step's lists) and several outputs: recorded twice on scaled values, the replay on the case's inputs agrees with lazy mode
    (a pass means it replayed: the oracle is n/a where capture keeps tracing)."""
    res = run_case(_filled_row(op), context=_context(), codegen_dir=str(tmp_path))
    assert (res["status"], res["checks"]["captured_vs_lazy"]) == ("pass", "pass"), res


@pytest.mark.parametrize("op, why", [
    ("aten.nonzero.default", "nonzero runs eagerly on the host (its output shape depends on values)"),
    ("aten.multi_margin_loss_backward.default",
     "multi_margin_loss_backward runs eagerly on the host (PyTorch has no shape function"),
    ("aten.transpose_.default", "it changes argument 0 in place from shape [16, 4, 64], strides [256, 64, 1] to "
                                "[4, 16, 64], [64, 256, 1] (resize_, transpose_"),
])
def test_capture_oracle_says_why_capture_keeps_tracing(tmp_path: Path, op: str, why: str) -> None:
    """A step capture refuses is traced on every call, which is right, not a finding; the check says why.
    (transpose_ was a finding first: a replay left the argument passed in its old shape.)"""
    case = _row(op) if "margin" in op else _filled_row(op)  # the margin loss has no row of 4 elements a tensor
    res = run_case(case, context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "pass", res
    assert res["checks"]["captured_vs_lazy"].startswith(f"n/a: capture did not replay the step: {why}"), res


def test_a_replay_of_stale_inputs_is_found_shrunk_and_reproduced(tmp_path: Path) -> None:
    """A capture bug (tests/fuzz_plugins/stale_capture.py: a replay reads the last recording's arguments) is
    a ``captured_vs_lazy`` mismatch; its repro script fails with the plugin and passes without it."""
    proc, s = _fuzz(tmp_path, "--seconds", "600", "--cases", "4", "--seed", "5", "--ops", "aten.mul.Tensor",
                    "--shrink-seconds", "5", "--plugin", "tests.fuzz_plugins.stale_capture")
    sig = "aten.mul.Tensor:mismatch:captured_vs_lazy"
    assert proc.returncode == 1 and sig in s["failures"], (s["failures"], proc.stderr[-3000:])
    assert all(k.endswith(":captured_vs_lazy") for k in s["failures"]), s["failures"]
    script = Path(s["failures"][sig]["repro"])
    runs = {flag: subprocess.run([sys.executable, str(script), *flag], cwd=tmp_path, env=ENV, capture_output=True,
                                 text=True, timeout=120) for flag in ((), ("--no-plugin",))}
    assert runs[()].returncode != 0 and "the captured step disagrees with lazy mode" in runs[()].stderr, runs[()]
    ok = runs[("--no-plugin",)]
    assert ok.returncode == 0 and "the captured step agrees with lazy mode" in ok.stdout, ok.stderr[-2000:]


# Found by fuzzing pfvm:cpu: eager's own _ctc_loss gradient changes with the targets' strides.
_CTC_STRIDED_TARGETS = {
    "op": "aten._ctc_loss.Tensor",
    "args": [{"contiguous": False, "dtype": "float32", "range": [-3.930759, -3.01057], "shape": [24, 2, 32],
              "stride": [32, 768, 1], "t": "tensor"},
             {"dtype": "int64", "range": [6, 30], "shape": [4], "t": "tensor", "contiguous": True, "stride": [1]},
             {"dtype": "int64", "range": [24, 24], "shape": [2], "t": "tensor", "contiguous": True, "stride": [1]},
             {"dtype": "int64", "range": [2, 2], "shape": [2], "t": "tensor", "contiguous": True, "stride": [1]}],
    "kwargs": {}, "mutations": [{"kind": "layout", "arg": "a1", "layout": "strided", "by": "fuzz"},
                                {"kind": "values", "arg": "a0", "dist": "simple", "by": "shrink"}],
    "value_seed": 174923168, "row": "aten._ctc_loss.Tensor[f32(24,2,32)nc|i64(4)|i64(2)|i64(2)]", "index": 8364,
}


def test_gradient_that_eager_computes_differently_on_strided_inputs_is_layout_sensitive(tmp_path: Path) -> None:
    """Eager's gradient of this case depends on the targets' strides; mncore's device buffers are dense and
    its gradient is eager's on contiguous copies: ``layout-sensitive``, as the output oracle has it, not a
    finding. The oracle's premise is checked too: eager's two gradients differ."""
    from harness.fuzz.oracles import _contiguous, grads

    case = Case.from_json(_CTC_STRIDED_TARGETS)
    args, kwargs = case.build_inputs()
    op = resolve_op(case.op)
    strided = grads(op, args, kwargs, "cpu", case.value_seed)
    dense = grads(op, _contiguous(args), _contiguous(kwargs), "cpu", case.value_seed)
    assert not torch.allclose(strided[0], dense[0])
    res = run_case(case, context=_context(), codegen_dir=str(tmp_path))
    assert (res["status"], res["checks"]["grad_vs_eager"]) == ("pass", "layout-sensitive"), res


# Found fuzzing mncore2:auto: a float16 matmul whose terms cancel; the board reads float16 operands in
# its half format (one mantissa bit fewer), so it differs from eager by more than twice eager's error.
_F16_MM_CANCELS = {
    "op": "aten.mm.default",
    "args": [{"contiguous": False, "dtype": "float32", "range": [-0.456735, 0.296436], "shape": [4, 2],
              "stride": [1, 4], "t": "tensor"},
             {"dtype": "float32", "range": [-2.316042, 2.689253], "shape": [2, 48], "t": "tensor",
              "contiguous": True, "stride": [48, 1]}],
    "kwargs": {}, "mutations": [{"kind": "dtype", "from": "float32", "to": "float16", "by": "fuzz"},
                                {"kind": "resize", "from": 48, "to": 1, "by": "shrink"}],
    "value_seed": 1702467744, "row": "aten.mm.default[f32(4,2)nc|f32(2,48)]", "index": 1508,
}


# The same on a batch holding an inf: eager's inf comes back, the finite elements differ by the format.
_F16_BMM_WITH_INF = {
    "op": "aten.bmm.default",
    "args": [{"dtype": "float32", "range": [-0.526204, 0.495763], "shape": [32, 1, 16], "t": "tensor",
              "contiguous": True, "stride": [16, 16, 1]},
             {"dtype": "float32", "range": [-0.524317, 0.582448], "shape": [32, 16, 1], "stride": [16, 1, 64],
              "t": "tensor", "contiguous": True}],
    "kwargs": {}, "mutations": [{"kind": "dtype", "from": "float32", "to": "float16", "by": "fuzz"},
                                {"kind": "values", "arg": "a1", "dist": "inf", "by": "fuzz"},
                                {"kind": "resize", "from": 16, "to": 1, "by": "shrink"},
                                {"kind": "resize", "from": 32, "to": 16, "by": "shrink"},
                                {"kind": "resize", "from": 16, "to": 8, "by": "shrink"}],
    "value_seed": 1383214328, "row": "aten.bmm.default[f32(32,1,16)|f32(32,16,1)]", "index": 12992,
}


# A 16-bit _grouped_mm: the op has no float64 kernel, so its board reference runs in float32.
_F16_GROUPED_MM = {
    "op": "aten._grouped_mm.default",
    "args": [{"dtype": "float32", "range": [-3.416804, 3.059628], "shape": [64, 32], "t": "tensor",
              "contiguous": True, "stride": [32, 1]},
             {"contiguous": False, "dtype": "float32", "range": [-0.076889, 0.084343], "shape": [4, 32, 64],
              "stride": [2048, 1, 32], "t": "tensor"},
             {"dtype": "int32", "range": [11, 64], "shape": [4], "t": "tensor", "contiguous": True, "stride": [1]}],
    "kwargs": {}, "mutations": [{"kind": "dtype", "from": "float32", "to": "float16", "by": "fuzz"},
                                {"kind": "resize", "from": 64, "to": 32, "by": "shrink"},
                                {"kind": "resize", "from": 32, "to": 16, "by": "shrink"},
                                {"kind": "resize", "from": 16, "to": 8, "by": "shrink"},
                                {"kind": "resize", "from": 4, "to": 1, "by": "shrink"},
                                {"kind": "values", "arg": "a0", "dist": "simple", "by": "shrink"}],
    "value_seed": 429698566, "row": "aten._grouped_mm.default[f32(64,32)|f32(4,32,64)nc|i32(4)]", "index": 7905,
}


def _emu2_context() -> Any:
    import mncore
    from mncore.context import Context, MNDevice

    mncore.init("emu2", implicit_sync="silent")
    ctx = Context(MNDevice("emu2"))
    Context.switch_context(ctx)
    return ctx


def test_board_format_explains_a_16_bit_matmul_and_a_wrong_rounding_is_still_found(sim_env, tmp_path: Path) -> None:
    """On a simulated board, a 16-bit matmul within twice eager's error of a float64 run on operands rounded
    to the board's half format is ``board-format``, not a finding. The premise is checked (plain noise
    filtering does not pass it), and an emulation that rounds operands to 7 mantissa bits instead of 9 is
    still a mismatch. Where an input holds an inf, eager's inf must come back and the finite elements are
    judged alike; an op without a float64 kernel (``_grouped_mm``) is judged against float32."""
    import mncore.devices.emu2 as emu2
    from harness.fuzz.oracles import eager_call, is_noise, lazy_call, to_double

    case = Case.from_json(_F16_MM_CANCELS)
    ctx = _emu2_context()
    args, kwargs = case.build_inputs()
    op = resolve_op(case.op)
    got, want = lazy_call(op, args, kwargs)[0], eager_call(op, args, kwargs)[0]
    assert not is_noise(got, want, lambda: op(*to_double(args)))
    res = run_case(case, context=ctx, codegen_dir=str(tmp_path))
    assert res["status"] == "pass", res
    assert res["checks"]["lazy_vs_eager"] == res["checks"]["grad_vs_eager"] == "board-format", res
    with_inf, grouped = Case.from_json(_F16_BMM_WITH_INF), Case.from_json(_F16_GROUPED_MM)
    assert not torch.isfinite(with_inf.build_inputs()[0][1]).all()
    for explained in (with_inf, grouped):
        res = run_case(explained, context=ctx, codegen_dir=str(tmp_path))
        assert (res["status"], res["checks"]["lazy_vs_eager"]) == ("pass", "board-format"), res
    sim_env.setattr(emu2, "_half_operand", lambda x: x.bfloat16().to(x.dtype)
                    if isinstance(x, torch.Tensor) and x.is_floating_point() else x)
    for wrong in (case, with_inf, grouped):
        res = run_case(wrong, context=ctx, codegen_dir=str(tmp_path))
        assert (res["status"], res.get("kind", "").split("_")[-1], res.get("oracle")) == (
            "fail", "mismatch", "lazy_vs_eager"), res


def test_board_format_rounding_is_the_boards_and_applies_only_where_the_board_rounds(sim_env) -> None:
    """The fuzzer's own rounding (bit arithmetic) agrees with known half values and with mncore's
    (``frexp``), and the format applies to matmul-class ops on 16-bit operands on a simulated board only."""
    import mncore
    from harness.fuzz.board_format import operand_format, round_to
    from mncore.compile.precision import round_to_format

    spec = {"mantissa_bits": 9, "exponent_bits": 6}
    x = torch.tensor([1 + 2 ** -10, 1 + 3 * 2 ** -10, -(1 + 2 ** -9), 2.0 ** -31, 2.0 ** 40, float("inf"), 0.0])
    want = torch.tensor([1.0, 1 + 2 ** -8, -(1 + 2 ** -9), 0.0, (2 - 2 ** -9) * 2.0 ** 31, float("inf"), 0.0])
    torch.testing.assert_close(round_to(x, spec), want.double(), rtol=0, atol=0)
    g = torch.Generator().manual_seed(0)
    y = torch.randn(5000, generator=g) * torch.exp2(torch.randint(-40, 40, (5000,), generator=g).float())
    torch.testing.assert_close(round_to(y, spec), round_to_format(y, "half").double(), rtol=0, atol=0)
    a16, a32 = torch.ones(2, 2, dtype=torch.float16), torch.ones(2, 2)
    mm, add = torch.ops.aten.mm.default, torch.ops.aten.add.Tensor
    mncore.init("pfvm:cpu")
    assert operand_format(mm, [a16, a16], {}) is None
    mncore.init("emu2")
    assert operand_format(mm, [a16, a16], {})["mantissa_bits"] == 9
    assert operand_format(mm, [a32, a32], {}) is None and operand_format(add, [a16, a16], {}) is None
    mncore.init("emu2", float_dtype="mixed")
    assert operand_format(mm, [a32, a32], {}) is not None


# Found fuzzing mncore2:auto: the gradient of pdist of an input with no rows; CPU's _pdist_backward divides
# by zero and the process dies (eager's own reference; mncore's gradient is the empty one).
_PDIST_NO_ROWS = {
    "op": "aten._pdist_forward.default",
    "args": [{"dtype": "float32", "range": [-1.543093, 1.537221], "shape": [2, 16], "t": "tensor",
              "contiguous": True, "stride": [16, 1]}],
    "kwargs": {}, "mutations": [{"kind": "resize", "from": 2, "to": 0, "by": "fuzz"},
                                {"kind": "values", "arg": "a0", "dist": "simple", "by": "shrink"}],
    "value_seed": 1434873344, "row": "aten._pdist_forward.default[f32(2,16)]", "index": 16331,
}


# Found fuzzing mncore2:auto: _pdist_backward of a 2-row input (one pair) with an empty gradient and pdist.
_PDIST_BACKWARD = {
    "op": "aten._pdist_backward.default",
    "args": [{"dtype": "float32", "range": [-1.0, 1.0], "shape": [0], "t": "tensor", "contiguous": True, "stride": [1]},
             {"dtype": "float32", "range": [-1.0, 1.0], "shape": [2, 1], "t": "tensor", "contiguous": True,
              "stride": [1, 1]},
             {"t": "float", "v": 2.0},
             {"dtype": "float32", "range": [0.0, 1.0], "shape": [0], "t": "tensor", "contiguous": True, "stride": [1]}],
    "kwargs": {}, "mutations": [], "value_seed": 7, "row": "aten._pdist_backward.default[f32(1)|f32(2,1)|2.0|f32(1)]",
    "index": 0,
}


def test_a_crash_of_eagers_reference_gradient_is_a_skip_not_a_finding(tmp_path: Path) -> None:
    """The gradient oracle computes eager's reference in its own phase: the worker dying there is eager's
    crash (a skip), as in the forward's eager phase; the case's forward oracles had passed. mncore's gradient
    then runs alone in a fresh worker (oracle ``grad_alone``) and lives: the empty gradient."""
    from harness.fuzz.worker import Worker

    assert Case.from_json(_PDIST_NO_ROWS).build_inputs()[0][0].shape == (0, 16)
    worker = Worker("pfvm:cpu", None, tmp_path / "worker.log", case_timeout=60)
    try:
        res = worker.run(_PDIST_NO_ROWS)
    finally:
        worker.close()
    assert res["status"] == "skip" and res["message"].startswith("eager reference crash"), res
    assert "phase eager_grad" in res["message"], res
    assert res["message"].endswith("(on the same inputs mncore returned a result)"), res  # its gradient, alone


# Found fuzzing (seed 20261231): weight norm of a v with no slices along dim; the CPU kernel divides by their
# number and the process dies of SIGFPE, eager's and (before it refused the call) pfvm's.
_WEIGHT_NORM_NO_SLICES = {
    "op": "aten._weight_norm_interface.default",
    "args": [{"dtype": "float32", "range": [-1.0, 1.0], "shape": [32, 2, 0], "t": "tensor", "contiguous": True,
              "stride": [2, 1, 1]},
             {"dtype": "float32", "range": [-1.0, 1.0], "shape": [1, 1, 0], "t": "tensor", "contiguous": True,
              "stride": [1, 1, 1]},
             {"t": "int", "v": 2}],
    "kwargs": {}, "mutations": [], "value_seed": 3, "row": "aten._weight_norm_interface.default[f32(32,2,0)]",
    "index": 0,
}


@pytest.mark.parametrize("plugin, finding", [("tests.fuzz_plugins.eager_unguarded", False),
                                             ("tests.fuzz_plugins.unguarded", True)])
def test_after_eagers_kernel_dies_mncore_runs_alone_and_must_not(tmp_path: Path, plugin: str, finding: bool) -> None:
    """A case eager's kernel dies on has no reference, yet mncore must not die on it too: a fresh worker runs it
    on mncore alone. mncore refusing it is a skip that says so; mncore dying too (its refusal taken away) is a
    crash finding of the ``lazy_alone`` oracle (``grad_alone`` for a gradient). Both plugins take the fuzzer's own skip of the case away."""
    from harness.fuzz.worker import Worker

    worker = Worker("pfvm:cpu", plugin, tmp_path / "worker.log", case_timeout=60)
    try:
        res = worker.run(_WEIGHT_NORM_NO_SLICES)
    finally:
        worker.close()
    if finding:
        assert (res["status"], res["kind"], res["oracle"]) == ("fail", "crash", "lazy_alone"), res
    else:
        assert res["status"] == "skip" and res["message"].startswith("eager reference crash"), res
        assert "phase eager;" in res["message"], res
        assert "mncore raised RuntimeError: mncore: _weight_norm_interface: v [32, 2, 0] has no slices" in res["message"]
    assert "eager_died" not in res


def test_cases_eagers_kernel_cannot_run_safely_are_skipped_before_it_runs(tmp_path: Path) -> None:
    """CPU's fused optimizer kernels and ``_pdist_backward`` trust their operands' sizes: given a smaller
    tensor they read or write past it and the worker dies later, in whatever phase runs next (found fuzzing:
    heap corruption reported in the lazy phase). No eager reference exists, so such a case is skipped
    before eager runs (mncore refuses it: ``tests/test_op_gaps.py``); a well-formed one is not."""
    case = Case.from_json(_PDIST_BACKWARD)
    res = run_case(case, context=None, codegen_dir=str(tmp_path))
    assert res["status"] == "skip" and res["message"].startswith("reference undefined: _pdist_backward: the "
                                                                  "gradient or pdist holds fewer than"), res
    assert res["checks"] == {} and "eager" not in res["timings"], res
    fine = json.loads(json.dumps(_PDIST_BACKWARD).replace('"shape": [0]', '"shape": [1]'))
    res = run_case(Case.from_json(fine), context=None, codegen_dir=str(tmp_path))
    assert not res.get("message", "").startswith("reference undefined"), res
    from harness.fuzz.oracles import unsafe_for_eager

    adam, params = torch.ops.aten._fused_adam_.default, [torch.zeros(4, 16), torch.zeros(4)]
    lists = [params] + [[torch.zeros_like(p) for p in params] for _ in range(3)] + [[]]
    assert unsafe_for_eager(adam, lists) == ""
    lists[2] = [torch.zeros(4, 16), torch.zeros(1)]
    assert "list 2 does not hold one tensor per parameter" in unsafe_for_eager(adam, lists)
    norm_backward = torch.ops.aten._weight_norm_interface_backward.default
    v = torch.zeros(3, 2, 4)
    assert unsafe_for_eager(norm_backward, [v, v, torch.zeros(1, 1, 4), torch.zeros(1, 1, 4), 2]) == ""
    assert unsafe_for_eager(norm_backward, [v, v, torch.zeros(0, 0, 1), torch.zeros(0, 0, 1), 2])
    # the forward writes its norms into a tensor laid out like g (found: g of 8 values for 128 norms)
    norm, v = torch.ops.aten._weight_norm_interface.default, torch.zeros(32, 2, 128)
    assert unsafe_for_eager(norm, [v, torch.zeros(1, 1, 128), 2]) == ""
    assert unsafe_for_eager(norm, [v, torch.zeros(32, 1, 1), 0]) == ""
    assert unsafe_for_eager(norm, [v, torch.zeros(2, 2, 2).transpose(0, 2), 2])
    assert unsafe_for_eager(norm, [v, torch.zeros(1, 1, 1).expand(1, 1, 128), 2])  # 128 values, room for 1
    # batch norm's kernels take one value per channel (found: a running_var of 1 value for 12 channels)
    bn, bn_backward, x = torch.ops.aten.native_batch_norm.default, torch.ops.aten.native_batch_norm_backward.default, \
        torch.zeros(2, 12, 3)
    per_channel, one = [torch.ones(12)] * 4, torch.ones(1)
    assert unsafe_for_eager(bn, [x, *per_channel, True, 0.1, 1e-5]) == ""
    assert "running_var holds fewer" in unsafe_for_eager(bn, [x, *per_channel[:3], one, True, 0.1, 1e-5])
    empty = torch.ones(0)  # evaluation saves no statistics, and its backward reads the running ones
    assert unsafe_for_eager(bn_backward, [x, x, per_channel[0], *per_channel[:2], empty, empty, False, 1e-5,
                                          [True] * 3]) == ""
    assert "grad_out holds fewer values than the input" in unsafe_for_eager(  # read as the input (found: NaN)
        bn_backward, [x[:, :, :1], x, per_channel[0], *per_channel[:2], empty, empty, False, 1e-5, [True] * 3])
    # CTC's kernels index by the used labels and fill a tensor shaped like log_alpha (found: a label past the
    # classes and a short log_alpha); padding past target_lengths is not read
    ctc, ctc_backward = torch.ops.aten._ctc_loss.Tensor, torch.ops.aten._ctc_loss_backward.Tensor
    log_probs, lengths, target_lengths = torch.zeros(10, 2, 5), torch.tensor([10, 10]), torch.tensor([2, 3])
    padded = torch.tensor([[1, 2, -1], [3, 4, 1]])
    assert unsafe_for_eager(ctc, [log_probs, padded, lengths, target_lengths]) == ""
    assert "not a class" in unsafe_for_eager(ctc, [log_probs, padded + 3, lengths, target_lengths])
    assert unsafe_for_eager(ctc, [log_probs, padded, lengths, torch.tensor([2, 3, 1])]) == ""  # eager refuses it
    alpha = torch.zeros(2, 10, 7)
    assert unsafe_for_eager(ctc_backward, [torch.ones(2), log_probs, padded, lengths, target_lengths, torch.ones(2),
                                           alpha, 0]) == ""
    assert "log_alpha smaller" in unsafe_for_eager(ctc_backward, [torch.ones(2), log_probs, padded, lengths,
                                                                  target_lengths, torch.ones(2), alpha[:, :, :4], 0])
    assert "grad or neg_log_likelihood holds fewer values" in unsafe_for_eager(  # one per sequence (found: reads past)
        ctc_backward, [torch.ones(1), log_probs, padded, lengths, target_lengths, torch.ones(2), alpha, 0])
    dense = torch.ops.aten.embedding_dense_backward.default  # scatters into num_weights rows by the indices
    assert unsafe_for_eager(dense, [torch.ones(2, 3), torch.tensor([0, 2]), 3, -1, False]) == ""
    assert "not a row of the 3-row gradient" in unsafe_for_eager(dense, [torch.ones(2, 3), torch.tensor([0, 3]), 3,
                                                                         -1, False])
    bag = torch.ops.aten._embedding_bag_backward.default  # offset2bag names a bag (a row of grad) per index
    i64 = dict(dtype=torch.int64)
    fine = [torch.ones(2, 3), torch.tensor([3, 5]), torch.tensor([0, 1]), torch.tensor([0, 1]), torch.ones(2, **i64),
            torch.zeros(0, **i64), 16, False, 1, False, None]
    assert unsafe_for_eager(bag, fine) == ""
    assert unsafe_for_eager(bag, fine[:3] + [torch.zeros(0, **i64)] + fine[4:]) == ""  # rebuilt by the backward
    assert "names bags the 0-bag gradient" in unsafe_for_eager(bag, [torch.ones(0, 3)] + fine[1:])
    assert "bag_size holds fewer" in unsafe_for_eager(bag, fine[:4] + [torch.zeros(0, **i64)] + fine[5:])
    pool = torch.ops.aten.adaptive_max_pool2d_backward.default  # scatters into each plane by the indices
    plane = torch.zeros(1, 2, 2, 2)
    assert unsafe_for_eager(pool, [plane, plane, torch.tensor([0, 3]).reshape(1, 2, 1, 1)]) == ""
    assert "outside the input's planes of 4" in unsafe_for_eager(pool, [plane, plane,
                                                                         torch.tensor([0, 4]).reshape(1, 2, 1, 1)])
    assert "save_mean holds fewer" in unsafe_for_eager(
        bn_backward, [x, x, per_channel[0], *per_channel[:2], empty, empty, True, 1e-5, [True] * 3])
    # adaptive pooling writes each grad_output plane's gradient into the input's plane of that number, and
    # fractional 3-d pooling reads grad_output and indices as the input's planes (found: a crash in a later case)
    zeros = torch.zeros(2, 3, 1, 1, **i64)
    assert "more planes than the input" in unsafe_for_eager(pool, [torch.ones(2, 3, 1, 1), plane, zeros])
    assert unsafe_for_eager(pool, [torch.ones(1, 2, 1, 1), torch.zeros(2, 2, 2, 2), zeros[:1, :2]]) == ""
    cdist = torch.ops.aten._cdist_backward.default  # reads a gradient and a distance per pair of rows (found: 4e22)
    x1, x2 = torch.zeros(2, 16), torch.zeros(3, 16)
    assert unsafe_for_eager(cdist, [torch.ones(2, 3), x1, x2, 2.0, torch.ones(2, 3)]) == ""
    assert "fewer values than x1 and x2 have pairs" in unsafe_for_eager(cdist, [torch.ones(2, 1), x1, x2, 2.0,
                                                                                torch.ones(2, 3)])
    ln = torch.ops.aten.native_layer_norm_backward.default  # grad_out as the input, a mean and rstd per row (found: NaN)
    x, stats = torch.zeros(2, 1, 32), torch.ones(2, 1, 1)
    assert unsafe_for_eager(ln, [x, x, [32], stats, stats, None, None, [True] * 3]) == ""
    assert "grad_out holds fewer values than the input" in unsafe_for_eager(ln, [x[:1], x, [32], stats, stats, None,
                                                                                 None, [True] * 3])
    assert "fewer than its 2 rows" in unsafe_for_eager(ln, [x, x, [32], stats, stats[:1], None, None, [True] * 3])
    gather = torch.ops.aten.gather.default  # an expanded int32 index skips eager's bounds check (found: no error)
    index = torch.tensor([16, 32], dtype=torch.int32).unsqueeze(1).expand(2, 32)
    assert "skips the bounds check" in unsafe_for_eager(gather, [torch.zeros(32, 32), 0, index])
    assert unsafe_for_eager(gather, [torch.zeros(32, 32), 0, index.long()]) == ""  # eager raises: both are compared
    assert unsafe_for_eager(gather, [torch.zeros(32, 32), 0, index.contiguous()]) == ""
    assert unsafe_for_eager(gather, [torch.zeros(33, 32), 0, index]) == ""  # in bounds
    # oneDNN's RNN layer backward trusts every size, its workspace's too (found: eager corrupting the heap)
    rnn = torch.ops.aten.mkldnn_rnn_layer_backward.default
    x, hx, w_ih, w_hh, bias = torch.zeros(5, 3, 4), torch.zeros(3, 6), torch.zeros(24, 4), torch.zeros(24, 6), torch.zeros(24)
    out, hy, cy, ws = torch.ops.aten.mkldnn_rnn_layer(x, w_ih, w_hh, bias, bias, hx, hx, False, [], 2, 6, 1, True, False,
                                                      False, True)
    tail = [None, None, False, 2, 6, 1, True, True, False, [], False]
    assert unsafe_for_eager(rnn, [x, w_ih, w_hh, bias, bias, hx, hx, out, hy, cy, out, *tail, ws]) == ""
    assert "shaped unlike the input" in unsafe_for_eager(rnn, [x, w_ih, w_hh, bias, bias, hx[:1], hx, out, hy, cy, out,
                                                               *tail, ws])
    assert "workspace is smaller" in unsafe_for_eager(rnn, [x, w_ih, w_hh, bias, bias, hx, hx, out, hy, cy, out, *tail,
                                                            ws[:1]])
    avg3d = torch.ops.aten._adaptive_avg_pool3d_backward.default  # 3-D: a grad_output plane per input plane
    pad = torch.ops.aten.replication_pad3d_backward.default  # a grad_output plane per input plane (found: NaN)
    assert "fewer planes than the input" in unsafe_for_eager(pad, [torch.ones(1, 3, 6, 6, 6), torch.ones(2, 3, 4, 4, 4),
                                                                   [1] * 6])
    assert unsafe_for_eager(pad, [torch.ones(2, 3, 6, 6, 6), torch.ones(2, 3, 4, 4, 4), [1] * 6]) == ""
    assert "fewer planes than the input" in unsafe_for_eager(avg3d, [torch.ones(1, 1, 2, 2, 2), torch.ones(1, 3, 4, 4, 4)])
    assert unsafe_for_eager(avg3d, [torch.ones(1, 3, 2, 2, 2), torch.ones(1, 1, 4, 4, 4)]) == ""
    frac = torch.ops.aten.fractional_max_pool3d_backward.default
    volume = torch.zeros(2, 3, 4, 4, 4)
    assert unsafe_for_eager(frac, [torch.ones(2, 3, 2, 2, 2), volume, [2] * 3, [2] * 3, torch.zeros(2, 3, 2, 2, 2, **i64)]) == ""
    assert "holds fewer values than the input's planes" in unsafe_for_eager(
        frac, [torch.ones(2, 3, 2, 2, 2), volume, [2] * 3, [2] * 3, torch.zeros(2, 1, 2, 2, 2, **i64)])
    # flash attention's backward reads grad_out, out and logsumexp by the query's sizes (found: a NaN mismatch)
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    q, kv = torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 5, 4)
    assert unsafe_for_eager(attention, [q, q, kv, kv, q, torch.zeros(1, 2, 3), 0.0, False]) == ""
    assert "shaped unlike the forward op's results" in unsafe_for_eager(
        attention, [q[..., :1], q, kv, kv, q, torch.zeros(1, 2, 3), 0.0, False])
    assert "does not fit the query" in unsafe_for_eager(  # a value of one batch for two (found corrupting the heap)
        attention, [q.expand(2, -1, -1, -1), q.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1), kv, q.expand(2, -1, -1, -1),
                    torch.zeros(2, 2, 3), 0.0, False])
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert unsafe_for_eager(forward, [torch.zeros(1, 4, 3, 4), kv, kv]) == ""  # grouped-query: heads a multiple
    # eager's _embedding_bag reads offsets as if contiguous (found: [0, 0] at stride 2 read as [0, 4])
    bag_forward, offsets = torch.ops.aten._embedding_bag.default, torch.tensor([0, 9, 0])
    assert unsafe_for_eager(bag_forward, [torch.ones(4, 2), torch.tensor([1]), offsets[::2].contiguous()]) == ""
    assert "strided indices or offsets" in unsafe_for_eager(bag_forward, [torch.ones(4, 2), torch.tensor([1]),
                                                                            offsets[::2]])
    assert "strided indices or offsets" in unsafe_for_eager(  # so are indices (found: eager raising on valid ones)
        bag_forward, [torch.ones(4, 2), torch.tensor([1, 0, 1])[::2], torch.tensor([0])])
    assert "does not fit the query" in unsafe_for_eager(forward, [torch.zeros(1, 3, 3, 4), kv, kv])
    # kernels that divide by a size that is 0 or walk a gradient by the input's batch (found: SIGFPE, SIGSEGV)
    assert "query or key of length 0" in unsafe_for_eager(forward, [q[:, :, :0], kv, kv])
    assert "query or key of length 0" in unsafe_for_eager(forward, [q, kv[:, :, :0], kv[:, :, :0]])
    assert unsafe_for_eager(forward, [q[:0], kv[:0], kv[:0]]) == ""  # no batch: eager runs it
    assert "no slices along dim" in unsafe_for_eager(norm, [torch.zeros(32, 2, 0), torch.zeros(1, 1, 0), 2])
    assert "no slices along dim" in unsafe_for_eager(norm_backward, [torch.zeros(0, 3)] * 2 + [torch.zeros(0, 1)] * 2 + [0])
    assert unsafe_for_eager(norm, [torch.zeros(3, 0), torch.zeros(3, 1), 0]) == ""  # slices of nothing: eager's
    assert "empty in a pooled dimension" in unsafe_for_eager(avg3d, [torch.ones(1, 3, 2, 2, 2), torch.ones(1, 3, 0, 4, 4)])
    avg2d = torch.ops.aten.avg_pool2d_backward.default
    pool_args = [[2, 2], [2, 2], [0, 0], False, True, None]
    assert "batch differs" in unsafe_for_eager(avg2d, [torch.ones(3, 8, 2, 2), torch.ones(2, 8, 4, 4), *pool_args])
    assert unsafe_for_eager(avg2d, [torch.ones(2, 8, 2, 2), torch.ones(2, 8, 4, 4), *pool_args]) == ""
    assert unsafe_for_eager(avg2d, [torch.ones(8, 2, 2), torch.ones(8, 4, 4), *pool_args]) == ""  # unbatched
    max3d, cube = torch.ops.aten.max_pool3d_with_indices_backward.default, torch.ones(2, 3, 2, 2, 2)
    pool3d = [cube, torch.ones(2, 3, 4, 4, 4), [2] * 3, [2] * 3, [0] * 3, [1] * 3, False]
    assert "indices holds fewer values" in unsafe_for_eager(max3d, pool3d + [torch.zeros(1, 3, 2, 2, 2, **i64)])
    assert unsafe_for_eager(max3d, pool3d + [torch.zeros(2, 3, 2, 2, 2, **i64)]) == ""
    # torchvision's RoI kernels read (backward: write) the image column 0 of each box names (found: NaN gradients)
    pytest.importorskip("torchvision")  # registers torch.ops.torchvision
    roi, roi_backward = torch.ops.torchvision.roi_align.default, torch.ops.torchvision._roi_align_backward.default
    boxes = torch.tensor([[1.9, 0.0, 0.0, 3.0, 3.0]])  # truncated: image 1
    assert unsafe_for_eager(roi, [torch.zeros(2, 1, 4, 4), boxes, 1.0, 2, 2, 2, False]) == ""
    assert "outside the batch of 1" in unsafe_for_eager(roi, [torch.zeros(1, 1, 4, 4), boxes, 1.0, 2, 2, 2, False])
    assert "outside the batch of 1" in unsafe_for_eager(roi_backward, [torch.ones(1, 1, 2, 2), boxes, 1.0, 2, 2, 1, 1,
                                                                       4, 4, 2, False])
    assert unsafe_for_eager(roi_backward, [torch.ones(1, 1, 2, 2), boxes, 1.0, 2, 2, 2, 1, 4, 4, 2, False]) == ""
    assert "shaped unlike the forward output [1, 1, 2, 2]" in unsafe_for_eager(
        roi_backward, [torch.ones(1, 1, 2, 1), boxes, 1.0, 2, 2, 2, 1, 4, 4, 2, False])
    assert "no rows or columns" in unsafe_for_eager(roi, [torch.zeros(2, 1, 0, 4), boxes, 1.0, 2, 2, 2, False])
    assert unsafe_for_eager(roi, [torch.zeros(2, 1, 0, 4), boxes[:0], 1.0, 2, 2, 2, False]) == ""  # no box: not read
    assert "fewer than the 5 columns" in unsafe_for_eager(  # read at 5 a box (found: SIGSEGV for no columns)
        roi_backward, [torch.ones(1, 1, 2, 2), boxes[:, :0], 1.0, 2, 2, 2, 1, 4, 4, 2, False])
    wide = torch.cat([boxes, boxes[:, :1]], 1)  # six columns: the backward kernel does not check (found: no error)
    assert "shaped unlike the forward output [1, 4, 2, 2]" in unsafe_for_eager(
        roi_backward, [torch.ones(1, 1, 2, 2), wide, 1.0, 2, 2, 2, 4, 4, 4, 2, False])
    two = torch.cat([boxes, boxes])
    two[0, 0] = 0.0
    assert unsafe_for_eager(roi_backward, [torch.ones(2, 1, 2, 2), two, 1.0, 2, 2, 2, 1, 4, 4, 2, False]) == ""
    six = torch.cat([two, torch.full((2, 1), -1.0)], 1)  # box 1's image is value 5, -1 (found: SIGSEGV)
    assert "outside the batch of 2" in unsafe_for_eager(
        roi_backward, [torch.ones(2, 1, 2, 2), six, 1.0, 2, 2, 2, 1, 4, 4, 2, False])


def test_margin_loss_of_an_empty_batch_has_no_eager_reference_but_context_still_checks_lazy(tmp_path: Path) -> None:
    """CPU's ``multi_margin_loss`` returns the mean of an empty batch without writing it (found fuzzing: two
    runs disagreed): eager is no reference there, but mncore's defined value is still checked between its
    Context API and lazy mode; an unreduced loss, which eager does define, is checked against eager."""
    case = {"op": "aten.multi_margin_loss.default", "kwargs": {}, "mutations": [], "value_seed": 3, "index": 0,
            "row": "aten.multi_margin_loss.default[f32(0,4)|i64(0)|1|1.0]",
            "args": [{"t": "tensor", "dtype": "float32", "range": [-1.0, 1.0], "shape": [0, 4], "stride": [4, 1],
                      "contiguous": True},
                     {"t": "tensor", "dtype": "int64", "range": [0, 3], "shape": [0], "stride": [1], "contiguous": True},
                     {"t": "int", "v": 1}, {"t": "float", "v": 1.0}]}  # reduction: the mean
    res = run_case(Case.from_json(case), context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "skip" and "reduced loss of an empty batch unwritten" in res["message"], res
    assert res["checks"]["context_vs_lazy"] == "pass" and res["checks"]["lazy_vs_eager"].startswith("n/a"), res
    case["kwargs"] = {"reduction": {"t": "int", "v": 0}}
    res = run_case(Case.from_json(case), context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "pass" and res["checks"]["lazy_vs_eager"] == "pass", res


def test_weight_norm_backward_with_extra_saved_g_values_has_no_eager_reference(tmp_path: Path) -> None:
    """Eager's ``_weight_norm_interface_backward`` leaves the ``grad_g`` values past v's slices unset (found
    fuzzing: flaky NaN mismatches): no reference, so mncore's refusal is a skip, not a finding; the g the
    forward takes is still checked against eager."""
    def tensor(shape: list[int]) -> dict:
        stride = [int(torch.Size(shape[i + 1:]).numel()) for i in range(len(shape))]
        return {"t": "tensor", "dtype": "float64", "range": [0.5, 1.5], "shape": shape, "stride": stride,
                "contiguous": True}

    case = {"op": "aten._weight_norm_interface_backward.default", "kwargs": {}, "mutations": [], "value_seed": 3,
            "index": 0, "row": "aten._weight_norm_interface_backward.default[f64(6,2,4)|f64(6,2,4)|f64(2,2,4)|"
                               "f64(2,2,4)|2]",
            "args": [tensor([6, 2, 4]), tensor([6, 2, 4]), tensor([2, 2, 4]), tensor([2, 2, 4]), {"t": "int", "v": 2}]}
    res = run_case(Case.from_json(case), context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "skip" and "leaves the others unset" in res["message"], res
    case["args"][2:4] = [tensor([1, 1, 4]), tensor([1, 1, 4])]
    res = run_case(Case.from_json(case), context=_context(), codegen_dir=str(tmp_path))
    assert res["status"] == "pass" and res["checks"]["lazy_vs_eager"] == "pass", res


def test_grouped_mm_on_rows_no_group_covers_has_no_eager_reference() -> None:
    """Eager's ``_grouped_mm`` and its backward leave what no group covers unset (found fuzzing: a gradient
    mismatch of up to 3e29 with an empty offsets tensor): no reference there; full coverage has one."""
    from harness.fuzz.oracles import left_unset

    op, int32 = torch.ops.aten._grouped_mm.default, dict(dtype=torch.int32)
    a, b = torch.ones(8, 4), torch.ones(2, 4, 4)
    assert left_unset(op, [a, b, torch.tensor([3, 8], **int32)]) == ""
    assert "2 of 8 grouped rows" in left_unset(op, [a, b, torch.tensor([3, 6], **int32)])
    assert "2 of 8 grouped rows" in left_unset(op, [a, b, torch.tensor([3, 6], **int32)], gradient=True)
    # 2-D by 2-D: the output is whole unless a group is empty; the gradient's columns past the last offset are not
    flat = [torch.ones(4, 8), torch.ones(8, 4)]
    assert left_unset(op, [*flat, torch.tensor([4, 6], **int32)]) == ""
    assert "2 of 8 grouped rows" in left_unset(op, [*flat, torch.tensor([4, 6], **int32)], gradient=True)
    assert "1 empty group" in left_unset(op, [*flat, torch.tensor([4, 4, 8], **int32)])
    assert left_unset(op, [*flat, torch.zeros(0, **int32)]) == ""  # no groups: an empty result
    assert left_unset(op, [torch.ones(2, 4, 4), torch.ones(2, 4, 4), None]) == ""
