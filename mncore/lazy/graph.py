"""``sync()``: cut the pending graph of all live lazy tensors, compile or reuse, and submit it.

The graph key is built from interned per-op signatures (op, non-tensor arguments, input
shapes/dtypes/strides), the wiring between nodes (which also captures input aliasing) and the
output set. Lifted scalars and random seeds are inputs, so their values never enter the key.
"""
from __future__ import annotations

import hashlib
import sys
import weakref
from typing import Any

from mncore.compiler import codegen, disk_cache, fx_build, lowering, pipeline
from mncore.compiler.cache import LRUCache
from mncore.compiler.program import Executable
from mncore.devices import sim
from mncore.lazy.ir import Data, Node, Scalar
from mncore.lazy.tensor import tracer
from mncore.runtime import metrics, timeline
from mncore.runtime.executor import Job, executor
from mncore.runtime.state import require_init, settings


cache = LRUCache()
_last_compiled: dict[str, Any] = {}
_last_sync_end = [timeline.now()]


def _collect(roots: list) -> tuple[list[Node], list[Data], list, tuple]:
    seen: set = set()
    order: list[Node] = []
    stack = [r for r in roots]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        order.append(n)
        for ref in n.inputs:
            if type(ref) is tuple:
                p = ref[0]
                if type(p) is Node and id(p) not in seen:
                    stack.append(p)
    order.sort(key=lambda n: n.seq)
    local: dict[int, int] = {}
    leaf_idx: dict[int, int] = {}
    leaves: list[Data] = []
    scalars: list = []
    items = []
    for j, n in enumerate(order):
        local[id(n)] = j
        codes = []
        for ref in n.inputs:
            if isinstance(ref, Scalar):
                scalars.append(ref)
                codes.append(None)
                continue
            p, i = ref
            if type(p) is Node:
                codes.append((local[id(p)], i))
            else:
                k = leaf_idx.get(id(p))
                if k is None:
                    k = leaf_idx[id(p)] = len(leaves)
                    leaves.append(p)
                codes.append(-1 - k)
        items.append((n.sig_id, tuple(codes)))
    return order, leaves, scalars, tuple(items)


def _stable_name(order: list[Node], key: tuple) -> str:
    """A name that is the same in every process for the same graph (it also keys the disk cache)."""
    h = hashlib.sha256()
    for n, item in zip(order, key[0]):
        h.update(repr((getattr(n.target, "__name__", str(n.target)), n.template, item[1],
                       tracer.sigs[n.sig_id][3])).encode())
    h.update(repr(key[1:-1]).encode())
    return "graph_" + h.hexdigest()[:16]


def _explain_recompile(name: str, order: list[Node], key: tuple) -> None:
    prev = _last_compiled.get("key")
    if prev is None:
        return
    prev_items, items = prev[0], key[0]
    lines = [f"mncore[recompile]: compiling {name} ({len(items)} ops); previous graph had {len(prev_items)} ops"]
    for j, (a, b) in enumerate(zip(prev_items, items)):
        if a != b:
            old, new = tracer.sigs[a[0]], tracer.sigs[b[0]]
            n = order[j]
            what = "op" if old[0] is not new[0] else ("input shapes/dtypes" if old[3] != new[3] else
                                                     "non-tensor arguments" if old[1:3] != new[1:3] else "wiring")
            lines.append(f"  first difference at op #{j}: {what} changed: was {old[0]} {old[1:]} now {new[0]} {new[1:]}")
            if n.frame:
                lines.append(f"  traced at {n.frame[0]}:{n.frame[1]} in {n.frame[2]}")
            break
    else:
        if len(prev_items) != len(items):
            lines.append("  the graph is a prefix/extension of the previous one (op count changed)")
        elif prev[1] != key[1]:
            lines.append("  the set of output tensors changed (a different set of tensors is alive at sync)")
        else:
            lines.append(f"  {key[2:]} vs {prev[2:]}: compile options or device changed")
    print("\n".join(lines), file=sys.stderr)


def _compile(order: list[Node], n_leaves: int, n_scalars: int, outputs: list, key: tuple, name: str,
             policy: str) -> Executable:
    t0 = timeline.now()
    if "recompile" in settings.debug:
        _explain_recompile(name, order, key)
    g = fx_build.build(order, n_leaves, n_scalars, outputs, settings.exec_device)
    exe = pipeline.compile_graph(g, name, key, policy, emulate=settings.simulated)
    t1 = timeline.now()
    exe.stats["compile_s"] = t1 - t0
    timeline.record("compile", f"compile {name}", t0, t1, nodes=len(order), kernels=exe.stats["kernels"])
    metrics.add("compiles")
    metrics.add("compile_s", t1 - t0)
    _last_compiled["key"] = key
    return exe


def sync(wait: bool = False, reason: str = "user") -> None:
    """Cut, compile (or reuse) and submit the pending graph; returns without waiting in async modes."""
    require_init()
    executor.raise_errors()
    t0 = timeline.now()
    waited = metrics._values["wait_s"]
    timeline.record("host", "trace", _last_sync_end[0], t0)
    storages = [s for s in list(tracer.pending) if type(s.value[0]) is Node]
    tracer.pending = weakref.WeakSet()
    tracer.epoch += 1
    if storages:
        try:
            _submit(storages)
        except BaseException:  # nothing was submitted: keep the graph pending so no value is lost
            for st in storages:
                tracer.pending.add(st)
            raise
    metrics.add("syncs")
    t1 = timeline.now()
    timeline.record("host", f"sync ({reason})", t0, t1)
    metrics.add("sync_s", t1 - t0 - (metrics._values["wait_s"] - waited))
    _last_sync_end[0] = t1
    if wait:
        executor.wait_all()


def build(refs: list[tuple], options: tuple = ()) -> tuple[Executable, list[Data], list]:
    """Collect the graph computing ``refs``; find or compile its executable.

    Returns the executable, the Data leaves it reads (in placeholder order) and its lifted
    scalars (``Scalar`` objects, seeds included). Shared by lazy ``sync()`` and the Context API.
    """
    roots = [r[0] for r in refs]
    order, leaves, scalars, items = _collect(roots)
    local = {id(n): j for j, n in enumerate(order)}
    outputs = [(local[id(r[0])], r[1]) for r in refs]
    policy = dict(options).get("float_dtype", settings.float_dtype)
    key = (items, tuple(outputs), settings.kind, settings.exec_device.type, options, policy, lowering.version())
    exe = cache.get(key)
    if exe is None:
        name = _stable_name(order, key)
        exe = disk_cache.get_or_compile(
            name, policy, key, lambda: _compile(order, len(leaves), len(scalars), outputs, key, name, policy))
        cache.put(key, exe)
        codegen.write_lazy(exe)
    else:
        metrics.add("cache_hits")
    if settings.simulated:
        sim.check_memory(exe)
    return exe, leaves, scalars


def _submit(storages: list) -> None:
    by_ref: dict[tuple, list] = {}
    for s in storages:
        by_ref.setdefault((id(s.value[0]), s.value[1]), []).append(s)
    keys = sorted(by_ref, key=lambda r: (by_ref[r][0].value[0].seq, r[1]))
    exe, leaves, scalars = build([by_ref[k][0].value for k in keys])
    out_leaves = []
    for k in keys:
        group = by_ref[k]
        leaf = Data(group[0].meta)
        leaf.graph = exe.name
        out_leaves.append(leaf)
        for s in group:
            s.value = (leaf, 0)
            s.version += 1
    executor.submit(Job(exe=exe, leaves=leaves, scalars=[s.value for s in scalars], outs=out_leaves))


def wait_device_ops() -> None:
    """Block until all submitted graphs finished; re-raises a worker error naming graph and op."""
    executor.wait_all()
