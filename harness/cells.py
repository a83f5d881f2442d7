"""Isolated cells: each unit of work runs in its own child process, so that a crash, an OOM, a signal
or a hang costs that cell's result and never the run.

A ``Job`` is ``python -m MODULE ARGS...`` that writes its result to a file; ``CellRunner`` starts
jobs (``--jobs N`` at a time) in their own process group with a log file, kills the whole group
on timeout or when the run is interrupted, makes each child die with the parent (Linux:
``PR_SET_PDEATHSIG``), and turns every ending into an ``Outcome``: the result file, a ``timeout``, an ``oom``
or a ``crash`` (a signal or an exit without a result), with the log's tail as the reason.
With ``preload``, jobs are forked from a fork server that imported those modules once (same isolation,
no per-cell interpreter start: the catalog's hundreds of tiny models). The tier runner, the
performance reports, the registry recorder and the catalog collector run their cells through it;
the fuzz worker (a fork server, not ``python -m``) shares the kill, log and exit rules below.
Where the children run is the cluster's (``harness.cluster``): here, or one per Ray task
(``harness.cluster_ray``), whose lost node gives a ``node_lost`` outcome.
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence, TypeVar

from harness.progress import Progress

if TYPE_CHECKING:
    from harness.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the interpreter children run with (tests substitute a crashing one)
OOM_EXIT_CODES = (-9, 137)  # SIGKILL (the kernel's OOM killer) seen directly or through a shell
TAIL_CHARS = 800  # log tail searched for an out-of-memory message
REASON_CHARS = 400  # of which the reason keeps this much
T = TypeVar("T")
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _resolve_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up here in the parent: the child may only call it (no loader locks)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _resolve_prctl()


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the parent dies (even by SIGKILL,
    which no handler sees), and ends a child whose parent is already gone. None off Linux."""
    if _PRCTL is None:
        return None
    prctl = _PRCTL

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def die_with_parent() -> None:
    """Have the kernel SIGKILL this (forked) process when its parent dies (Linux; elsewhere nothing)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a cell: offline Hugging Face, quiet transformers, this checkout importable
    (``extra``: the driver's settings, for a cell started on another node)."""
    return {**os.environ, **(extra or {}), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONPATH": str(ROOT)}


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (the child and anything it started); gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def log_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` bytes of a log, decoded ('' when there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def exit_kind(returncode: int | None, tail: str) -> str:
    """How a child that gave no result ended: ``oom`` (killed by SIGKILL or said so), else ``crash``."""
    return "oom" if returncode in OOM_EXIT_CODES or "out of memory" in tail.lower() else "crash"


@dataclass(frozen=True)
class Job:
    """``python -m module *args``; the child writes its result to ``result`` (its log goes beside it)."""

    label: str
    module: str
    args: tuple[str, ...]
    result: Path
    device: str | None = None  # the device the cell runs on: what it asks a cluster for (a GPU, a board)

    @property
    def log(self) -> Path:
        return self.result.with_suffix(".log")


@dataclass(frozen=True)
class Outcome:
    """How a job ended: ``kind`` is ``result`` (the result file exists), ``timeout``, ``oom``, ``crash`` or
    ``node_lost`` (the cluster lost the worker or node that ran it)."""

    job: Job
    kind: str
    returncode: int | None
    wall_s: float
    reason: str  # '' for a result
    node: str = ""  # the address of the cluster node it ran on ('' when it ran here)


@dataclass
class Running:
    """A started child: its job, process, open log and start time."""

    job: Job
    proc: Any  # subprocess.Popen, or a _Forked (same poll/wait/pid)
    log: IO[Any]
    t0: float


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start children without re-importing the parent's ``__main__``.

    ``multiprocessing`` re-runs the parent's main script in every forkserver child (pytest's or
    ``harness``'s: slow) and fails outright when there is none (``python - < script``). The entry
    points of forked children (the fuzz worker's, ``_run_forked``) live in modules, so they never need it.
    """
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            del main.__spec__


def _run_forked(module: str, args: tuple[str, ...], log_path: str) -> None:
    """A forked cell (in the fork server's child): own session, output to the log, ``python -m`` semantics
    (modules are found on the fork server's ``sys.path``, the parent's when it started)."""
    os.setsid()
    die_with_parent()  # the fork server ends with the run: so does the cell
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(child_env())
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class _Forked:
    """A cell forked from a fork server that has already imported ``preload`` (a fresh cell then starts
    in milliseconds, not the seconds of importing torch and its libraries), with Popen's poll/wait/pid."""

    def __init__(self, ctx: Any, job: Job):
        self.proc = ctx.Process(target=_run_forked, args=(job.module, job.args, str(job.log)))
        with main_module_hidden():
            self.proc.start()
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def wait(self) -> int | None:
        self.proc.join()
        return self.proc.exitcode


def start(job: Job, extra_env: Mapping[str, str] | None = None, fork: Any = None) -> Running:
    """Start ``job``'s child in its own process group, dying with this process, its output in its log
    (``fork``: a forkserver context whose server preloaded the libraries: the child is forked from it)."""
    job.result.parent.mkdir(parents=True, exist_ok=True)
    job.result.unlink(missing_ok=True)
    log = job.log.open("w")
    if fork is not None:
        return Running(job, _Forked(fork, job), log, time.monotonic())
    proc = subprocess.Popen([PYTHON, "-m", job.module, *job.args], stdout=log, stderr=subprocess.STDOUT,
                            env=child_env(extra_env), cwd=ROOT, start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()))
    return Running(job, proc, log, time.monotonic())


def end(r: Running, timed_out: bool, timeout: float) -> Outcome:
    """Reap a child (killing its group first when it ``timed_out``) and say how it ended."""
    if timed_out:
        kill_group(r.proc.pid)
    rc = r.proc.wait()
    r.log.close()
    wall = time.monotonic() - r.t0
    if timed_out:
        return Outcome(r.job, "timeout", None, wall, f"no result after {timeout:g}s")
    if r.job.result.exists():
        return Outcome(r.job, "result", rc, wall, "")
    kill_group(r.proc.pid)  # what the dead child started must not outlive it
    tail = log_tail(r.job.log).strip()
    return Outcome(r.job, exit_kind(rc, tail), rc, wall, f"child exited {rc}: {tail[-REASON_CHARS:]}")


def stop(running: Sequence[Running]) -> None:
    """Interrupted: kill every child's group before waiting for any, so none is left behind."""
    for r in running:
        kill_group(r.proc.pid)
    for r in running:
        r.proc.wait()
        r.log.close()


class CellRunner:
    """Runs jobs in child processes on a cluster (default: here, ``jobs`` at a time), with a progress
    line per finished job."""

    def __init__(self, total: int, desc: str, *, jobs: int = 1, timeout: float = 900.0,
                 cluster: Cluster | None = None, preload: Sequence[str] = ()):
        """``preload``: modules a fork server imports once; each local job is then forked from it (Linux)
        instead of started as a new interpreter; the isolation (own process group, log, timeout, kill) is
        the same. A given ``cluster`` (Ray) starts its own children."""
        from harness.cluster import LocalCluster

        self.timeout = timeout
        self._fork: Any = None
        if preload and cluster is None and "forkserver" in multiprocessing.get_all_start_methods():
            self._fork = multiprocessing.get_context("forkserver")
            self._fork.set_forkserver_preload(list(preload))
        self.cluster = cluster or LocalCluster(jobs, fork=self._fork)
        self.bar = Progress(total, desc)

    def __enter__(self) -> CellRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()

    def skip(self, label: str) -> None:
        """Count a job that needs no child (its answer is already known)."""
        self.bar.step(label)

    def run(self, jobs: Sequence[Job], finish: Callable[[Outcome], T],
            status: Callable[[T], str] = lambda v: v.status) -> list[T]:  # type: ignore[attr-defined]
        """``finish(outcome)`` of every job as it ends, returned in the order of ``jobs``; ``status``
        labels the progress line. Stopped (an exception, ``Interrupted``), the cluster ends every child."""
        done: dict[int, T] = {}
        with contextlib.closing(self.cluster.outcomes(jobs, self.timeout)) as outcomes:
            for i, outcome in outcomes:
                done[i] = finish(outcome)
                where = f" on {outcome.node}" if outcome.node else ""
                self.bar.step(f"{outcome.job.label}: {status(done[i])} ({outcome.wall_s:.0f}s{where})")
        return [done[i] for i in range(len(jobs))]
