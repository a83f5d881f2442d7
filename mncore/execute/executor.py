"""Job submission: one worker thread and FIFO queue per process, with the seed's three modes.

``sync``: the host waits for each graph. ``async_naive``: ``sync()`` returns at once and the
worker prepares and runs the job while the host traces on (they contend for the GIL).
``async`` (default): the host waits on an event until the worker's host-side preparation of
the job is done, then traces on while the device runs. A device that computes nothing and only
models time (a simulator in performance mode) has its jobs scheduled on the submitting thread in
``sync`` and ``async`` modes, without the worker; ``async_naive`` keeps the worker, whose contention
with the tracing host is what that mode shows. A device that computes on the host's own cores
(pfvm on the CPU) runs a graph on the submitting thread in those two modes when nothing is queued,
unless the graph is large (``MNCORE_CPU_THREAD``): see :func:`_here`.
"""
from __future__ import annotations

import atexit
import math
import operator
import queue
import sys
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from mncore import config
from mncore.config import settings
from mncore.devices import KernelFailed, registry
from mncore.devices.timing import hold_until
from mncore.errors import DeviceExecutionError
from mncore.ir import buffers
from mncore.ir.latch import Latch
from mncore.ir.values import describe_site
from mncore.observe import hooks, metrics, timeline


@dataclass(eq=False)
class Job:
    exe: Any
    leaves: list
    scalars: list
    outs: list
    submitted: float = 0.0
    device: Any = None  # the device attached when it was submitted
    release: list = field(default_factory=list)  # values to drop after the run, on the worker thread
    prepared: Latch = field(default_factory=Latch)  # the worker has its inputs (async mode waits for this)
    done: Latch = field(default_factory=Latch)


class _FindFailingOp(fx.Interpreter):
    def run_node(self, n: fx.Node) -> Any:
        try:
            return super().run_node(n)
        except Exception as e:
            raise _OpFailed(n, e) from e


class _OpFailed(Exception):
    def __init__(self, node: fx.Node, exc: Exception):
        super().__init__(str(exc))
        self.node, self.exc = node, exc


class Executor:
    def __init__(self) -> None:
        self._q: queue.Queue = queue.Queue()
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._modelled_end = 0.0  # the modelled end of the last job run without the worker (perf_counter clock)

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="mncore-worker", daemon=True)
            self._thread.start()

    def submit(self, job: Job) -> float:
        """Queue ``job``; waits per the execution mode and returns the seconds waited."""
        if hooks.graph_observers:
            summary = {"name": job.exe.name, "nodes": job.exe.n_nodes, "stats": dict(job.exe.stats)}
            for observe in hooks.graph_observers:
                observe(summary)
        job.submitted = timeline.now()
        job.device = device = registry.active()
        mode = settings.execution
        if mode != "async_naive" and not self._q.unfinished_tasks:  # the worker is idle and may be skipped
            if device.models_only():
                return self._schedule(job)
            if device.computes_on_host() and _here(job.exe):
                return self._run_here(job)
        self._ensure_thread()
        self._q.put(job)
        t0 = timeline.now()
        if mode == "sync":
            job.done.wait()
        elif mode == "async":
            job.prepared.wait()
        waited = timeline.now() - t0
        metrics.add("wait_s", waited)
        return waited

    def _run_here(self, job: Job) -> float:
        """``_run`` on the submitting thread, for a device that computes on the host's own cores (pfvm:cpu;
        see :func:`_here`). Returns the run's seconds, which callers keep out of their host spans.
        An interrupt during the run (Ctrl-C) fails the job's outputs: no reader waits for values never made."""
        t0 = timeline.now()
        try:
            self._run(job, on_worker=False)
        except BaseException as e:
            if not all(leaf.ready.is_set() for leaf in job.outs):
                self._store(job, None, DeviceExecutionError(
                    f"mncore: graph {job.exe.name} was interrupted ({type(e).__name__}) before it finished"), True)
                for latch in _latches(job):
                    latch.set()
            job.prepared.set()
            job.done.set()
            raise
        return timeline.now() - t0

    def _schedule(self, job: Job) -> float:
        """Run ``job`` on the submitting thread, for a device that computes nothing and only models time
        (a simulator in performance mode): its outputs become ready at the job's modelled end, and a
        reader is held until then. The worker would add two thread hand-offs per job (submit, then the host
        resuming after the worker blocks; 30-60 us each on a loaded 2-core machine, CPython's GIL),
        which the board's own runtime does not have. Returns the seconds waited (``sync`` mode only)."""
        exe = job.exe
        t0 = timeline.now()
        # an input's error is rare: look at the attribute of every input, call failure() only on those that have one
        err = next((e for e in [leaf.failure() for leaf in job.leaves if leaf.error is not None] if e is not None), None)
        inherited = err is not None
        if err is None:
            try:
                result = job.device.schedule(exe, job.leaves, job.submitted)  # outputs as exe.output_metas say
            except Exception as e:  # noqa: BLE001 - reported to the host, never swallowed
                err = self._describe(exe, [], e)
        self._store(job, None if err is not None else (result.outs, _layout(exe)[2]), err, inherited)
        if err is None:
            for latch in _latches(job):
                latch.set_at(result.end, hold_until)
            job.done.set_at(result.end, hold_until)
            with self._lock:
                self._modelled_end = max(self._modelled_end, result.end)
            _record_modelled(exe, result)
        else:
            for latch in _latches(job):
                latch.set()
            job.done.set()
        job.prepared.set()
        job.release.clear()
        metrics.add("execute_s", timeline.now() - t0)
        metrics.add("graphs_executed")
        waited = 0.0
        if settings.execution == "sync":
            t1 = timeline.now()
            job.done.wait()
            waited = timeline.now() - t1
        metrics.add("wait_s", waited)
        return waited

    def drain(self) -> None:
        """Block until every submitted job finished (errors stay queued); for jobs run without the worker,
        until the modelled end of the last one."""
        if self._thread is not None:
            self._q.join()
        hold_until(self._modelled_end)

    def wait_all(self) -> None:
        """Block until every submitted job finished; re-raise the first worker error."""
        self.drain()
        self.raise_errors()

    def raise_errors(self) -> None:
        with self._lock:
            if not self._errors:
                return
            err, self._errors = self._errors[0], []
        raise err

    def shutdown(self) -> None:
        """Drain the queue and stop the worker (at interpreter exit, so no thread dies mid-kernel);
        a graph error nobody has seen yet (no wait, and no read of its outputs: ``Leaf.wait`` marks those) is
        printed rather than lost."""
        if self._thread is not None and self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout=60)
        self._thread = None
        with self._lock:
            unseen, self._errors = [e for e in self._errors if not getattr(e, "seen", False)], []
        for err in unseen:
            print(f"mncore: a graph failed after the last sync()/wait_device_ops() and nothing read its "
                  f"results: {err}", file=sys.stderr)

    def _loop(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            try:
                self._run(job)
            finally:
                job = None
                self._q.task_done()

    def _run(self, job: Job, on_worker: bool = True) -> None:
        """Prepare and run ``job`` (on the worker, or on the submitting thread: no preparation span then,
        it is part of the host's)."""
        exe = job.exe
        t0 = timeline.now()
        inherited = False
        try:
            args = [leaf.wait(for_user=False) for leaf in job.leaves] + job.scalars
        except BaseException as e:  # an input came from a failed graph (already reported through it)
            args = None
            err: BaseException | None = e
            inherited = True
        else:
            err = None
        job.prepared.set()
        t1 = timeline.now()
        if on_worker:
            timeline.record("worker", f"prepare {exe.name}", t0, t1)
        result = None
        if err is None:
            try:
                result = job.device.run(exe, job.leaves, args, job.submitted)
                outs, sizes = _conform_outputs(exe, result.outs)
            except Exception as e:  # noqa: BLE001 - reported to the host, never swallowed
                err = self._describe(exe, args, e)
        t2 = timeline.now()
        self._store(job, None if err is not None else (outs, sizes), err, inherited)
        # counted before the outputs are released: a reader of one then sees this graph in the metrics
        if result is not None and result.modelled_s is not None:
            if result.measured_lane is not None:
                timeline.record(result.measured_lane, exe.name, t1, t2, nodes=exe.n_nodes,
                                time="measured (host emulation)")
            _record_modelled(exe, result)
        else:
            timeline.record("device", exe.name, t1, t2, nodes=exe.n_nodes, time="measured")
        metrics.add("execute_s", t2 - t1)
        metrics.add("graphs_executed")
        for latch in _latches(job):
            latch.set()
        job.release.clear()  # freeing large buffers takes time: not on the host's (unless it runs here)
        job.done.set()

    def _store(self, job: Job, outs: tuple[Any, list[int]] | None, err: BaseException | None,
               inherited: bool) -> None:
        """The job's outputs (results, their sizes) into the buffer table (the values they replace may be
        freed now), or its error on every output, kept for the host unless an input's graph already
        reported it (``inherited``)."""
        if err is None:
            buffers.put_new([leaf.bid for leaf in job.outs], *outs)
            for leaf in job.outs:
                leaf.fallback = None
            return
        for leaf in job.outs:
            leaf.error = err
        if not inherited:
            with self._lock:
                self._errors.append(err)

    @staticmethod
    def _describe(exe: Any, args: list, exc: Exception) -> DeviceExecutionError:
        op = "?"
        if isinstance(exc, DeviceExecutionError):
            return exc
        if isinstance(exc, KernelFailed):
            op, exc = _op_name(exc.node, f", kernel {exc.kernel}"), exc.exc
            return DeviceExecutionError(f"mncore: graph {exe.name} failed at op {op}: {type(exc).__name__}: {exc}")
        try:
            _FindFailingOp(exe.gm).run(*args)
        except _OpFailed as f:
            op = _op_name(f.node)
        except Exception:  # noqa: BLE001 - best effort only
            pass
        return DeviceExecutionError(f"mncore: graph {exe.name} failed at op {op}: {type(exc).__name__}: {exc}")


HERE_MAX_BYTES = 256 << 20  # MNCORE_CPU_THREAD=auto: larger graphs (by their memory plan's peak) go to the worker


def _here(exe: Any) -> bool:
    """Whether a graph of a device that computes on the host's cores runs on the submitting thread
    (``MNCORE_CPU_THREAD``). On 2 cores the worker bought little overlap for small graphs (the kernels'
    intra-op threads already use every core) and cost two thread hand-offs per graph, while its team of
    intra-op threads slowed the host's, and the host's slowed its, about 2x: the seed MLP's captured step
    at w=256 took 2.2x as long there. Graphs whose memory plan peaks above ``HERE_MAX_BYTES`` (the MLP at
    w=4096, GPT-2 small) ran faster on the worker, with half the resident memory (the main thread's
    allocator arena kept what they freed). ``python benchmarks/cpu_thread.py`` measures both."""
    where = config.get("cpu_thread")
    if where == "auto":
        return exe.plan is None or exe.plan.peak_bytes <= HERE_MAX_BYTES
    return where == "caller"


def _record_modelled(exe: Any, result: Any) -> None:
    """A simulated job's modelled span on the timeline's device lane, and its time in the metrics."""
    timeline.record("device", exe.name, result.start, result.end, nodes=exe.n_nodes, time="modelled",
                    modelled_s=result.modelled_s)
    metrics.add("modelled_device_s", result.modelled_s)


def _op_name(node: fx.Node, extra: str = "") -> str:
    """The op, its FX node and where the user's program first traced it."""
    site = node.meta.get("mn_site")
    where = f"; first traced at {describe_site(site)}" if site else ""
    target = node.target  # a built-in substitute (a plain function) names the op it runs
    shown = target.op if isinstance(target, types.FunctionType) and hasattr(target, "op") else target
    return f"{shown} (node {node.name}{extra}{where})"


def _latches(job: Job) -> list[Latch]:
    """The latches of ``job``'s outputs, each once (one per job, as a rule): a latch is set, or given its
    modelled end, once, not once per output."""
    latches: list[Latch] = []
    for leaf in job.outs:
        if not latches or leaf.ready is not latches[-1]:
            latches.append(leaf.ready)
    return latches


def _layout(exe: Any) -> tuple[list, list, list[int]]:
    """The shapes, dtypes and byte sizes of ``exe``'s outputs as traced (kept per executable)."""
    layout = _expected.get(exe)
    if layout is None:
        metas = exe.output_metas
        layout = _expected[exe] = ([None if m is None else m.shape for m in metas],
                                   [None if m is None else m.dtype for m in metas],
                                   [0 if m is None else math.prod(m.shape) * m.dtype.itemsize for m in metas])
    return layout


def _conform_outputs(exe: Any, outs: tuple) -> tuple[tuple, list[int]]:
    """Hold every result to the shape and dtype it was traced with; returns the results and their sizes.

    Eager CPU kernels do not validate every input combination, and a few return outputs that are
    undefined in a mode as empty tensors (batch-norm statistics in eval) or in another dtype than
    their meta kernel (half layer-norm statistics). Empty placeholders become zeros of the traced
    shape and dtype differences are cast; any other shape difference would corrupt later reads
    silently, so it fails naming the op.
    """
    expected = _layout(exe)
    if ([getattr(o, "shape", None) for o in outs] == expected[0]
            and [getattr(o, "dtype", None) for o in outs] == expected[1]):
        return outs, expected[2]  # the rule: every output as traced (two list comparisons, not a loop per output)
    fixed = None
    for i, (o, m) in enumerate(zip(outs, exe.output_metas)):
        if m is None or not isinstance(o, torch.Tensor):
            continue
        if o.shape != m.shape:
            if o.numel() != 0:
                node = next(n for n in reversed(exe.graph.nodes) if n.op == "output").args[0][i]
                if node.target is operator.getitem:  # one output of a multi-output op: name the op
                    node = node.args[0]
                raise DeviceExecutionError(
                    f"mncore: graph {exe.name} failed at op {_op_name(node)}: it returned "
                    f"{list(o.shape)} {o.dtype} but was traced as {list(m.shape)} {m.dtype}; its inputs are probably invalid")
            o = torch.zeros(m.shape, dtype=m.dtype, device=o.device)
        elif o.dtype != m.dtype and not (exe.policy == "double" and o.dtype == torch.float64):
            o = o.to(m.dtype)
        else:
            continue
        fixed = fixed or list(outs)
        fixed[i] = o
    outs = outs if fixed is None else tuple(fixed)
    return outs, [getattr(o, "nbytes", 0) for o in outs]  # a double-policy result is larger than traced


_expected: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # executable -> its outputs' (shapes, dtypes, sizes)
executor = Executor()
atexit.register(executor.shutdown)
