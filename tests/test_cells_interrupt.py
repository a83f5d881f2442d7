"""Stopping a run (fault injection): SIGINT/SIGTERM to ``harness run`` kill its children and keep the
finished rows; SIGKILL to the parent (no handler runs) still takes its children down."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cells, cli, expectations
from reports.schema import ModelRow

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
WAIT_S = 60  # generous bound for a child to appear or vanish; the tests poll, they never time anything


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {WAIT_S}s"
        time.sleep(0.05)


def _fake_children(tmp_path: Path, monkeypatch) -> Path:
    """mlp_w64's child writes a pass row at once; mlp_w128's writes its pid and sleeps. Returns the pid file."""
    row = ModelRow(model="mlp_w64", config="tiny", backend="pfvm:cpu", steps=1, time_kind="measured wall time",
                   status="pass", reason="", repro="", graphs_per_step=1, compiles_after_warmup=0).to_json()
    pidfile = tmp_path / "hung.pid"
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys, time\nfrom pathlib import Path\n"
                    "out = Path(sys.argv[sys.argv.index('--out') + 1])\n"
                    "if 'mlp_w128' in sys.argv:\n"
                    f"    Path({str(pidfile)!r}).write_text(str(os.getpid()))\n    time.sleep(600)\n"
                    f"out.write_text({json.dumps(json.dumps(row))})\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cells, "PYTHON", str(fake))
    monkeypatch.setattr(expectations, "EXPECTED_DIR", tmp_path / "expected")
    return pidfile


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_kills_children_and_finalizes_what_finished(tmp_path, monkeypatch, capsys, sig):
    pidfile = _fake_children(tmp_path, monkeypatch)

    def written() -> bool:  # the file exists before the child's pid is in it
        return pidfile.exists() and bool(pidfile.read_text().strip())

    def stop_when_the_second_cell_runs() -> None:
        deadline = time.monotonic() + WAIT_S
        while not written() and time.monotonic() < deadline:
            time.sleep(0.05)
        if written():  # else the run ended on its own and the asserts below say how
            os.kill(os.getpid(), sig)

    out = tmp_path / "r"
    stopper = threading.Thread(target=stop_when_the_second_cell_runs)
    stopper.start()
    code = cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny,mlp_w128:tiny", "--out", str(out)])
    stopper.join()
    assert code == 128 + sig
    err = [line for line in capsys.readouterr().err.splitlines() if "interrupted" in line]
    assert len(err) == 1 and signal.Signals(sig).name in err[0] and "1 of 2 cells" in err[0], err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["model"] for r in rows] == ["mlp_w64"]
    assert list(pd.read_csv(out / "results.csv")["model"]) == ["mlp_w64"]
    summary = (out / "summary.md").read_text()
    assert "interrupted by" in summary and "| not checked |" in summary and "0 expected, 0 new, 0 changed, 1 not checked" in summary
    assert "interrupted by" in (out / "index.html").read_text()
    assert json.loads((out / "meta.json").read_text())["interrupted"] == signal.Signals(sig).name
    assert not _running(int(pidfile.read_text()))  # killed and reaped before main returned


def test_children_die_when_the_parent_is_killed(tmp_path):
    """SIGKILL to a parent running a cell: the kernel kills the child too (PR_SET_PDEATHSIG)."""
    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    fake.chmod(0o755)
    parent = subprocess.Popen([sys.executable, "-c", (
        "from pathlib import Path\nfrom harness import cells\n"
        f"cells.PYTHON = {str(fake)!r}\n"
        f"job = cells.Job('hangs', 'harness.runner', (), Path({str(tmp_path / 'hangs.json')!r}))\n"
        "with cells.CellRunner(1, 'test', timeout=600) as r:\n    r.run([job], lambda o: o, status=lambda o: o.kind)\n")],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "child pid file")
        child = int(pidfile.read_text())
        assert _running(child)
        parent.kill()
        parent.wait()
        _wait_for(lambda: not _running(child), "end of the orphaned child")
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends(sig):
    """What a deferred block writes is written whole: the signal waits for the end of the block, is raised
    there as ``Interrupted``, and the raising handlers are back afterwards."""
    from harness.interrupt import Interrupted, deferred, signals_raise

    done = []
    with signals_raise():
        with pytest.raises(Interrupted) as info:
            with deferred():
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # a handler that raised would have interrupted the block by now
                done.append("the rest of the block")
        assert done == ["the rest of the block"] and info.value.signum == sig
        with pytest.raises(Interrupted):  # outside the block a signal raises at once again
            os.kill(os.getpid(), sig)
            time.sleep(1)


class _SignalsWhenCollected:
    """Sends ``sig`` to this process from ``__del__``, where Python prints an exception instead of raising it
    (as in a gc callback or a weakref finalizer): the handler's ``Interrupted`` is swallowed there."""

    def __init__(self, sig: int):
        self.sig = sig

    def __del__(self) -> None:
        signal.raise_signal(self.sig)  # runs the handler before it returns


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_whose_exception_python_swallowed_is_raised_by_the_next_check(sig, monkeypatch):
    """The lost SIGTERM of a fuzz campaign: the handler fired inside a gc callback, the exception was only
    printed, and the campaign ran on to its time budget. ``check()`` raises it at the loop's next turn, and the
    signal is forgotten once the block ends."""
    from harness import interrupt

    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: swallowed.append(u.exc_type))
    with pytest.raises(interrupt.Interrupted) as info:
        with interrupt.signals_raise():
            _SignalsWhenCollected(sig)  # collected at once: the exception goes to sys.unraisablehook
            assert swallowed == [interrupt.Interrupted]
            interrupt.check()
    assert info.value.signum == sig
    interrupt.check()  # nothing pending outside the block


def test_a_local_cluster_stops_waiting_for_a_signal_python_swallowed(tmp_path, monkeypatch):
    """The wait for a cell's child checks for a swallowed signal at each poll: it raises ``Interrupted`` and
    kills the child instead of waiting for the cell's timeout."""
    from types import SimpleNamespace

    from harness import cluster, interrupt

    pidfile = tmp_path / "child.pid"
    fake = tmp_path / "fake_python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cells, "PYTHON", str(fake))
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    polls_after = []

    def sleep(s: float) -> None:  # the poll's sleep: once the child runs, a signal arrives and is swallowed
        time.sleep(s)
        if polls_after:
            polls_after.append(s)
            assert len(polls_after) < 100, "the wait went on after the signal"
        elif pidfile.exists() and pidfile.read_text().strip():
            polls_after.append(s)
            _SignalsWhenCollected(signal.SIGTERM)

    monkeypatch.setattr(cluster, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    job = cells.Job("hangs", "harness.runner", (), tmp_path / "hangs.json")
    with pytest.raises(interrupt.Interrupted):
        with interrupt.signals_raise():
            list(cluster.LocalCluster(1).outcomes([job], timeout=600))
    assert polls_after and not _running(int(pidfile.read_text()))  # killed and reaped before the raise
