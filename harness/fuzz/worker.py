"""Isolated execution: cases run in a worker process, so a crash or hang costs one case, not the run.

Workers are forked from a ``multiprocessing`` fork server that has already imported torch and
mncore (a fresh worker then starts in milliseconds instead of the ~2 s of an import, which keeps
crash-heavy campaigns and the shrinker's fresh-worker confirmations cheap). The fork server itself
starts in a clean interpreter, so no parent state or threads are inherited. A worker initialises
mncore on the backend, imports the plugin module if any, and then answers one case at a time,
announcing each phase (``eager``, then the oracle it is in) so that a crash or hang is attributed
to the oracle that was running. Its stdout and stderr go to a log file (fault handler on). With
``malloc_check`` the fork server, and so every worker, runs under glibc's checking allocator
(``harness.fuzz.heap_check``).
"""
from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from harness.cells import die_with_parent, exit_kind, kill_group, log_tail, main_module_hidden
from harness.fuzz import heap_check

_PRELOAD = ["torch", "mncore", "mncore.context", "harness.fuzz.oracles", "harness.fuzz.warmup"]
# One tiny case run by every worker before it reports ready (first-call costs of tracing, compiling
# and the Context API), so that a case's timeout measures the case.
_WARMUP = {"op": "aten.add.Tensor", "kwargs": {}, "args": [
    {"t": "tensor", "shape": [2], "dtype": "float32", "stride": [1], "contiguous": True}] * 2}
ALONE = "mncore_alone"  # a case message key: run it on mncore only, as eager's phase named there died on it
READY_TIMEOUT_S = 120.0  # the first start imports torch in the fork server
HANG_FACTOR = 20.0  # a case may take this many times eager's time on top of the base timeout ...
MAX_EXTENSION = 5.0  # ... but at most this many base timeouts


def load_plugin(plugin: str, base: str | None = None) -> None:
    """Import ``plugin``: a ``.py`` file path, or a module name (``tests.fuzz_plugins.wrong_mul``)
    importable as it is or found as a file under ``base`` (the directory the campaign started in)."""
    if plugin.endswith(".py") or os.sep in plugin:
        _import_file(path := Path(base or ".", plugin).resolve(), path.stem)
        return
    try:
        importlib.import_module(plugin)
    except ModuleNotFoundError:
        path = Path(base or ".", *plugin.split(".")).with_suffix(".py")
        if not path.is_file():
            raise
        _import_file(path, plugin)


def _import_file(path: Path, name: str) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import plugin file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def _worker_main(conn: Any, backend: str, plugin: str | None, cwd: str, log_path: str, codegen_dir: str) -> None:
    """Entry point of a worker process (runs in the child, in its own process group, ending with the fork
    server, which ends with the campaign: a campaign killed by its cluster leaves no worker behind)."""
    os.setsid()
    die_with_parent()
    log = open(log_path, "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.enable(log)
    try:
        import warnings

        import mncore
        from harness.fuzz.cases import Case
        from harness.fuzz.oracles import run_alone, run_case
        from mncore.context import Context, MNDevice

        warnings.simplefilter("ignore")  # thousands of cases: warnings would only flood the log
        # torch.fx's Interpreter (mncore names a failing op with it) builds a tqdm bar, and tqdm's
        # default lock is a named multiprocessing semaphore, which leaks whenever a worker is killed.
        import threading

        from tqdm import tqdm

        tqdm.set_lock(threading.RLock())
        mncore.init(backend, implicit_sync="silent")
        if plugin:
            load_plugin(plugin, cwd)
        context = Context(MNDevice(backend))
        Context.switch_context(context)
        run_case(Case.from_json(_WARMUP), context, codegen_dir)
    except BaseException:  # noqa: BLE001 - report set-up failures (bad plugin, bad backend) to the parent
        conn.send(("setup_error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid(), heap_check.active()))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        t0 = time.perf_counter()
        print(f"--- case {msg.get('index')} {msg.get('op')}", flush=True)

        def phase(name: str) -> None:
            conn.send(("phase", name, time.perf_counter() - t0))

        if msg.get(ALONE):
            result = run_alone(Case.from_json(msg), msg[ALONE] == "eager_grad", phase)
        else:
            result = run_case(Case.from_json(msg), context, codegen_dir, phase)
        conn.send(("done", result))


class WorkerSetupError(RuntimeError):
    """The worker could not start (bad backend string, plugin import error, ...)."""


_server_env: dict[str, str] | None = None  # what this process's fork server was started with


def _ensure_server(env: dict[str, str]) -> None:
    """Start multiprocessing's fork server (one per process, unless it is running) with ``env`` added to
    its environment: LD_PRELOAD takes effect only when a process starts, and every worker is forked
    from this one."""
    global _server_env
    from multiprocessing import forkserver

    if _server_env is not None and _server_env != env:
        raise WorkerSetupError("this process's fuzz workers already run " + ("with" if _server_env else "without")
                               + " glibc's checking allocator: a campaign with the other --malloc-check setting "
                                 "needs a process of its own")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with main_module_hidden():
            forkserver.ensure_running()
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    _server_env = env


class Worker:
    """One worker process at a time; ``run`` returns an outcome dict even when the worker dies."""

    def __init__(self, backend: str, plugin: str | None, log_path: Path, case_timeout: float, base: str | None = None,
                 malloc_check: bool = False):
        """``base``: the directory a plugin given as a relative path or file is found under (default: here);
        ``malloc_check``: run under glibc's checking allocator (WorkerSetupError where glibc lacks it)."""
        self.backend, self.plugin, self.log_path, self.case_timeout = backend, plugin, Path(log_path), case_timeout
        self.base = base or os.getcwd()
        try:
            self.env = heap_check.environment() if malloc_check else {}
        except ValueError as e:
            raise WorkerSetupError(str(e)) from None
        self.proc: Any = None
        self.conn: Any = None
        self.restarts = 0
        self.starts = 0
        self.codegen_dir = tempfile.mkdtemp(prefix="mncore-fuzz-")  # Context compiles write here (reused)
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(_PRELOAD)

    def prepare(self) -> None:
        """Launch the fork server now, so its imports overlap with whatever the caller does next."""
        _ensure_server(self.env)

    def start(self) -> None:
        _ensure_server(self.env)  # Process.start would restart a dead fork server without the environment
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        parent, child = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=_worker_main, daemon=True,
                                      args=(child, self.backend, self.plugin, self.base, str(self.log_path),
                                            self.codegen_dir))
        with main_module_hidden():
            self.proc.start()
        child.close()
        self.conn = parent
        self.starts += 1
        if not parent.poll(READY_TIMEOUT_S):
            self.stop()
            raise WorkerSetupError(f"fuzz worker did not start within {READY_TIMEOUT_S:.0f} s (log: {self.log_path})")
        try:
            msg = parent.recv()
        except EOFError:
            code = self._reap()
            raise WorkerSetupError(f"fuzz worker died while starting (exit {code}); log: {self.log_path}") from None
        if msg[0] != "ready":
            self.stop()
            raise WorkerSetupError(f"fuzz worker set-up failed:\n{msg[1]}")
        if self.env and not msg[2]:  # the fork server was already running: the allocator cannot be added now
            self.stop()
            raise WorkerSetupError("--malloc-check: the fuzz worker does not run under glibc's checking allocator "
                                   "(this process's fork server started without it); run the campaign in a "
                                   "process of its own")

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            kill_group(self.proc.pid)
            self.proc.join(timeout=5)
        code = self.proc.exitcode
        self.proc, self.conn = None, None
        return code

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.proc is None:
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(timeout=2)
        if self.proc.is_alive():
            kill_group(self.proc.pid)
        self._reap()

    def close(self) -> None:
        """Stop the worker and remove its scratch directory."""
        self.stop()
        shutil.rmtree(self.codegen_dir, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def _kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid)
        self._reap()

    def _last_output(self, n: int = 8000) -> str:
        """What the worker printed in the case that killed it: the abort message, then the fault handler's
        frames, innermost first (the list of extension modules at the end is left out)."""
        text = log_tail(self.log_path, n).rpartition("\n--- case ")[2]
        lines = [line for line in text.splitlines()[1:] if not line.startswith("Extension modules:")]
        return "\n".join(lines).strip() or "(no output)"

    def run(self, case_json: dict) -> dict:
        """Run one case; a dead worker gives ``kind=crash``, a stuck one ``kind=hang`` (and is killed).

        When eager's kernel takes the worker down, there is no reference, but mncore must still not die
        on the same inputs (found so: several kernels eager and pfvm share crash the process): a fresh
        worker runs the case on mncore alone, where a crash or hang is a finding (oracle ``lazy_alone``, or
        ``grad_alone`` where eager died computing the gradients)."""
        result = self._run_once(case_json)
        died = result.pop("eager_died", None)
        if died:
            alone = self._run_once(dict(case_json, **{ALONE: died}))
            if alone["status"] == "fail":
                return alone
            result["message"] += f"\n(on the same inputs {alone['message']})"
        return result

    def _run_once(self, case_json: dict) -> dict:
        if self.proc is None:
            self.start()
        t_start = time.monotonic()
        self.conn.send(case_json)
        phase, deadline, extended = "start", t_start + self.case_timeout, False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.conn.poll(remaining):
                if self.conn.poll(0):
                    continue
                self._kill()
                self.restarts += 1
                return _abnormal("hang", phase, f"no answer within {deadline - t_start:.1f} s (phase {phase}); "
                                                f"worker killed and restarted", time.monotonic() - t_start)
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                time.sleep(0.05)
                code = self._reap()
                self.restarts += 1
                output = self._last_output()  # its start is what matters: the message keeps that
                return _abnormal(exit_kind(code, output), phase, f"worker died (exit code {code}) in phase {phase}; "
                                                                 f"log tail:\n{output[:1500]}", time.monotonic() - t_start)
            if msg[0] == "phase":
                phase = msg[1]
                if phase != "eager" and not extended:  # slow-but-working cases are not hangs
                    extended = True
                    deadline = t_start + self.case_timeout + min(HANG_FACTOR * msg[2], MAX_EXTENSION * self.case_timeout)
            elif msg[0] == "done":
                result = msg[1]
                result["timings"]["case"] = time.monotonic() - t_start
                return result


def _abnormal(kind: str, phase: str, message: str, seconds: float) -> dict:
    """The outcome of a case whose worker crashed or hung; in an eager phase (the reference outputs or
    gradients) it is not mncore's."""
    if phase in ("start", "eager", "eager_grad"):
        return {"status": "skip", "category": "valid", "checks": {}, "timings": {"case": seconds},
                "message": f"eager reference {kind}: {message}",
                "eager_died": phase if phase != "start" else None}
    return {"status": "fail", "category": "valid", "kind": kind, "oracle": phase, "checks": {phase: "fail"},
            "timings": {"case": seconds}, "message": message}
