"""``sync()``: cut the pending graph of all live lazy tensors, find or compile its executable, submit it.

The graph goes through the same key, cache and executor as the Context API (``graph_for``).
Lifted scalars and random seeds are inputs, so their values never enter the key.
"""
from __future__ import annotations

from dataclasses import dataclass

from mncore import cache
from mncore.config import require_init, settings
from mncore.devices import registry
from mncore.execute import Job, executor
from mncore.graph import Collected, collect
from mncore.ir.latch import Latch
from mncore.ir.values import Data, Node, Scalar
from mncore.compile.executable import Executable
from mncore.observe import metrics, timeline
from mncore.trace import gcpolicy
from mncore.trace.state import WeakList, tracer
from mncore.trace.tensor import Storage

_last_sync_end = [timeline.now()]


def graph_for(refs: list[tuple], options: tuple = ()) -> tuple[Executable, list[Data], list[Scalar]]:
    """Collect the graph computing ``refs``; find or compile its executable; check it fits the device.

    Returns the executable, the Data leaves it reads (in placeholder order) and its lifted
    scalars (``Scalar`` objects, seeds included). Shared by lazy ``sync()`` and the Context API.
    """
    exe, g = compiled(refs, options)
    return exe, g.leaves, g.scalars


def compiled(refs: list[tuple], options: tuple = ()) -> tuple[Executable, Collected]:
    """``graph_for``, returning the collected graph itself (step capture reads its nodes)."""
    t0 = timeline.now()
    g = collect(refs)
    t1 = timeline.now()
    policy = dict(options).get("float_dtype", settings.float_dtype)
    device = registry.active()
    exe, reused = cache.executable_for(g, device, options, policy, explain="recompile" in settings.debug)
    device.check_memory(exe)
    if reused:
        gcpolicy.at_reuse()
    metrics.add("collect_s", t1 - t0)
    metrics.add("lookup_s", timeline.now() - t1)  # a compile on a miss included (also in compile_s)
    return exe, g


def sync(wait: bool = False, reason: str = "user") -> None:
    """Cut, compile (or reuse) and submit the pending graph; returns without waiting in async modes.

    A graph that failed since the last ``sync()`` raises here (in ``execution="sync"``, the graph
    this call ran); an implicit sync (a host read) raises only for the value it reads. Inside a
    step that ``mncore.capture`` records, the cut is left to the end of the step.
    """
    require_init()
    user = reason == "user"
    if user and tracer.recording is not None:
        tracer.recording.synced = True
        return
    if user:
        executor.raise_errors()
    with tracer.lock:
        cut(reason)
    gcpolicy.at_cut()  # here, not in cut(): what cut() returns still holds the whole graph
    if user and settings.execution == "sync":
        executor.raise_errors()
    if wait:
        executor.wait_all()


@dataclass(eq=False)
class Submitted:
    """One graph cut as submitted: the executable, its collected graph, the roots it computes (in
    output order) with the storages that took each output, the new leaves, and for each of those
    storages the device value it held before the cut (None for a storage made since the last cut)."""

    exe: Executable
    graph: Collected
    roots: list[tuple]
    groups: list[list[Storage]]
    outs: list[Data]
    before: dict[int, Data | None]


def cut(reason: str, extra: tuple = ()) -> Submitted | None:
    """Collect every pending root (and the values ``extra``), submit their graph and point the roots
    at its output leaves; returns what was submitted (None when nothing was pending)."""
    t0 = timeline.now()
    waited = 0.0
    timeline.record("host", "trace", _last_sync_end[0], t0)
    storages = [s for s in tracer.pending.live() if type(s.value[0]) is Node]
    tracer.pending = WeakList()
    tracer.new_epoch()
    done = None
    if storages or extra:
        try:
            done, waited = _submit(storages, extra)
        except BaseException:  # nothing was submitted: keep the graph pending so no value is lost
            for st in storages:
                tracer.pending.add(st)
            raise
    metrics.add("syncs")
    t1 = timeline.now()
    timeline.record("host", f"sync ({reason})", t0, t1)
    metrics.add("sync_s", t1 - t0 - waited)
    _last_sync_end[0] = t1
    return done


def _submit(storages: list, extra: tuple) -> tuple[Submitted, float]:
    """Submit the graph computing ``storages`` and ``extra``; also returns the seconds spent waiting
    for the worker."""
    by_ref: dict[tuple, list] = {}  # keyed by the value itself: a Node hashes and compares by identity
    for s in storages:
        by_ref.setdefault(s.value, []).append(s)
    for r in extra:
        by_ref.setdefault(r, [])
    keys = sorted(by_ref, key=_trace_order)
    exe, g = compiled(keys)
    metrics.add("cut_nodes", len(g.order))
    out_leaves, groups, before = [], [], {}
    ready = Latch()
    for k in keys:
        group = by_ref[k]
        leaf = Data(group[0].meta if group else k[0].sig.metas[k[1]], ready=ready)
        leaf.graph = exe.name
        out_leaves.append(leaf)
        groups.append(group)
        for s in group:
            before[id(s)] = s.committed[0] if s.committed is not None else None
            store(s, leaf)
    t0 = timeline.now()
    waited = executor.submit(Job(exe=exe, leaves=g.leaves, scalars=[s.value for s in g.scalars], outs=out_leaves))
    metrics.add("submit_s", timeline.now() - t0 - waited)
    return Submitted(exe, g, keys, groups, out_leaves, before), waited


def _trace_order(ref: tuple) -> tuple[int, int]:
    return ref[0].seq, ref[1]


def store(s: Storage, leaf: Data) -> None:
    """``s`` now holds ``leaf``, the output of a job being submitted; if that job fails, readers fall
    back to the device value ``s`` held before (its committed one, when a write left it pending)."""
    old = s.committed[0] if s.committed is not None else s.value[0]
    if type(old) is Data and leaf.fallback is None:
        leaf.fallback = old
    s.committed = None
    s.value = (leaf, 0)
    s.version += 1
    leaf.own(s)


def mark_host_end(t: float) -> None:
    """A replayed step ends the host's work like a graph cut: the next trace span starts here."""
    _last_sync_end[0] = t
    gcpolicy.at_cut()


def wait_device_ops() -> None:
    """Block until all submitted graphs finished; re-raises a worker error naming graph and op."""
    executor.wait_all()
