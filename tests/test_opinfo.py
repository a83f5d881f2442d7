"""PyTorch's OpInfo, nn module and optimizer databases on mncore (pfvm:cpu) against eager CPU
(``harness.suites``).

``-m unit`` (in ``make test``) runs a deterministic sample: every ``UNIT_EVERY``-th op and every
``UNIT_MODULES_EVERY``-th module in sorted order, ``UNIT_CAP`` samples each, and every optimizer (a few
seconds in all). ``-m opinfo`` runs every op, module and optimizer with the suite's default cap (the
first 8 samples), forward and backward. Entries of ``ci/expected_op_failures.json`` (suites
``opinfo``/``modules``/``optim``) apply as strict xfails: a fixed op XPASSes and fails until its entry is
removed.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import mncore
from harness import expected
from harness.suites import modules, opinfo, optim
from harness.suites.opinfo import DEFAULT_CAP
from reports.schema import OpRow

DEVICE = "pfvm:cpu"
UNIT_EVERY = 24
UNIT_MODULES_EVERY = 16
UNIT_CAP = 2
ENTRIES = expected.load()


def _params(suite: str, names: list[str], marks: list) -> list:
    out = []
    for n in names:
        x = expected.lookup(n, DEVICE, suite, ENTRIES)
        xf = [pytest.mark.xfail(strict=True, reason=f"[{x.category}] {x.reason}")] if x else []
        out.append(pytest.param(n, id=n, marks=marks + xf))
    return out


def _check(result: opinfo.OpResult) -> None:
    if result.status in ("eager_fail", "skipped"):  # no reference to compare with (CUDA-only jiterator ops)
        pytest.skip(f"{result.name}: {result.status}: {result.message}")
    assert result.status == "pass", result.reason


OPS = list(opinfo.database())
MODULES = list(modules.database())
OPTIMIZERS = list(optim.database())


@pytest.mark.parametrize("name", _params("opinfo", opinfo.sample_unit(OPS, UNIT_EVERY), [pytest.mark.unit]))
def test_opinfo_sample(name):
    mncore.init_cpu(implicit_sync="silent")
    _check(opinfo.run_op(name, "mncore", cap=UNIT_CAP))


@pytest.mark.parametrize("name", _params("modules", opinfo.sample_unit(MODULES, UNIT_MODULES_EVERY), [pytest.mark.unit]))
def test_module_db_sample(name):
    mncore.init_cpu(implicit_sync="silent")
    _check(modules.run_module(name, "mncore", cap=UNIT_CAP))


@pytest.mark.parametrize("name", _params("optim", OPTIMIZERS, [pytest.mark.unit]))
def test_optim_db(name):
    mncore.init_cpu(implicit_sync="silent")
    _check(optim.run_optimizer(name, "mncore", cap=UNIT_CAP))


@pytest.mark.unit
def test_optim_suite_catches_a_wrong_kernel():
    """A wrong ``sqrt`` (x1.5: Adam's for-loop denominator) fails Adam's for-loop samples; its foreach ones
    (``_foreach_sqrt``) still pass. The parameters are drawn outside the sample, so the check compares
    values, not metadata only."""
    mncore.init_cpu(implicit_sync="silent")
    op = torch.ops.aten.sqrt.default
    mncore.register_lowering(op, lambda x: torch.sqrt(x) * 1.5)
    try:
        res = optim.run_optimizer("Adam", "mncore", cap=2)
    finally:
        mncore.unregister_lowering(op)
    assert res.status == "fail" and res.stage == "forward", res
    assert "[for-loop]" in res.failing_sample and "not close" in res.message, res
    assert res.passed == res.samples - 2  # the two for-loop samples; foreach and capturable pass


@pytest.mark.unit
def test_optim_suite_catches_a_wrong_fused_kernel():
    """A wrong ``_fused_adam_`` (parameters x1.5 after the update) fails Adam's fused samples only. The op
    has no functional twin, so the trace wraps it (clone, then mutate): the override must reach the
    kernel inside that wrapper, or it would be accepted and silently never run."""
    mncore.init_cpu(implicit_sync="silent")
    op = torch.ops.aten._fused_adam_.default

    def wrong(params, *args, **kwargs):
        op(params, *args, **kwargs)
        torch._foreach_mul_(params, 1.5)

    mncore.register_lowering(op, wrong)
    try:
        res = optim.run_optimizer("Adam", "mncore", cap=2)
    finally:
        mncore.unregister_lowering(op)
    assert res.status == "fail" and "[fused]" in res.failing_sample and "not close" in res.message, res
    assert res.passed == res.samples - 2  # the two fused samples


@pytest.mark.parametrize("name", _params("opinfo", OPS, [pytest.mark.opinfo]))
def test_opinfo(name):
    mncore.init_cpu(implicit_sync="silent")
    _check(opinfo.run_op(name, "mncore", cap=DEFAULT_CAP))


@pytest.mark.parametrize("name", _params("modules", MODULES, [pytest.mark.opinfo]))
def test_module_db(name):
    mncore.init_cpu(implicit_sync="silent")
    _check(modules.run_module(name, "mncore", cap=DEFAULT_CAP))


@pytest.mark.unit
def test_expected_entries_name_database_ops():
    """Every opinfo/modules entry names an op of this torch's database (stale names are reported here)."""
    known = {"opinfo": set(OPS), "modules": set(MODULES), "optim": set(OPTIMIZERS)}
    stale = [f"{x.suite}:{x.op}" for x in ENTRIES if x.suite in known and x.op not in known[x.suite]]
    assert not stale, "entries of ci/expected_op_failures.json name no database op: " + ", ".join(stale)


@pytest.mark.unit
def test_cli_writes_op_rows(tmp_path):
    """``harness run --tier unit --suite opinfo``: one schema-checked row per op, pass rates, exit 0; an
    unknown op name is refused before anything runs (exit 2)."""
    cmd = [sys.executable, "-m", "harness.cli", "run", "--tier", "unit", "--suite", "opinfo", "--ops", "add,neg",
           "--backend", DEVICE, "--samples", "2", "--out", str(tmp_path / "ok")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    fields = set(OpRow.field_names())  # each row also repeats the run's provenance (stamped)
    rows = [OpRow.from_json({k: v for k, v in json.loads(line).items() if k in fields}, where="results.jsonl")
            for line in (tmp_path / "ok" / "results.jsonl").read_text().splitlines()]
    assert [(r.model, r.status, r.config, r.checks) for r in rows] == [("add", "pass", "op_db", "forward+backward"),
                                                                       ("neg", "pass", "op_db", "forward+backward")]
    assert all(1 <= r.steps <= 2 and r.samples_pass == r.steps for r in rows)
    rates = json.loads((tmp_path / "ok" / "pass_rates.json").read_text())
    assert (rates["ops"], rates["ops_pass"], rates["samples"]) == (2, 2, sum(r.steps for r in rows))
    bad = subprocess.run(cmd[:-1] + [str(tmp_path / "bad"), "--ops", "nosuchop"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "nosuchop" in bad.stderr


@pytest.mark.unit
def test_cli_runs_the_optimizer_suite(tmp_path):
    cmd = [sys.executable, "-m", "harness.cli", "run", "--tier", "unit", "--suite", "optim", "--ops", "SGD,SparseAdam",
           "--backend", DEVICE, "--samples", "1", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["model"], r["status"], r["config"], r["suite"]) for r in rows] == [
        ("SGD", "pass", "optim_db", "optim"), ("SparseAdam", "skipped", "optim_db", "optim")]
    # its first input as a for-loop, a foreach and a fused optimizer (SGD has no capturable flag)
    assert rows[0]["steps"] == rows[0]["samples_pass"] == 3
    assert "sparse" in rows[1]["reason"]


@pytest.mark.unit
def test_rows_judged_by_entries():
    """A failing op with an entry is ``xfail``; a passing one with an entry is ``xpass`` and fails the run."""
    from harness.suites.run import problems, row

    entry = expected.ExpectedFailure("add", "*", "*", "not-implemented", "because", "opinfo")
    passing = {"name": "add", "status": "pass", "samples": 2, "passed": 2}
    failing = {"name": "add", "status": "fail", "samples": 2, "passed": 1, "failing_sample": "#1", "stage": "forward",
               "message": "mismatch"}
    got = [row("opinfo", r, DEVICE, 2, True, es) for r in (passing, failing) for es in ([], [entry])]
    assert [r.status for r in got] == ["pass", "xpass", "fail", "xfail"]
    assert [r.model for r in got if problems([r])] == ["add", "add"]
    assert "remove the entry" in got[1].reason and "mismatch" in got[3].reason
