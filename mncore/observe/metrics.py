"""The runtime's metrics: one fixed vocabulary of counters and timings, safe to update from any thread.

Every name is declared in ``COUNTERS`` or ``TIMINGS`` (``add`` of anything else raises). Each
thread adds into its own accumulator, so the hot path (one ``add`` per traced op) takes no lock
and no update is lost when the tracer, autograd's thread and the worker count at once; readers
sum the accumulators. Gauges (``live_buffers``) are read from their owner when reported.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import Counter
from typing import Callable

COUNTERS = {
    "traced_ops": "aten ops recorded by the tracer",
    "graphs_executed": "graphs the worker finished",
    "compiles": "graphs compiled (in-memory and disk cache misses)",
    "cache_hits": "graph cuts served by the in-memory compile cache",
    "implicit_syncs": "host reads that cut the graph before sync()",
    "fallback_ops": "data-dependent ops run eagerly",
    "syncs": "graph cuts (sync() calls, implicit ones included)",
    "cut_nodes": "ops in the graphs cut by sync() (sync_s over this is the cut's cost per node)",
    "bytes_to_device": "bytes uploaded from the host",
    "bytes_to_host": "bytes read back to the host",
    "disk_cache_hits": "executables loaded from the disk cache",
    "disk_cache_misses": "disk cache look-ups that found nothing",
    "disk_cache_corrupt": "disk cache entries that failed their checksum or decoding",
    "gc_collections": "garbage collections run by Python (any thread)",
    "captures": "calls of a captured step that traced it and recorded the graph (mncore.capture)",
    "replays": "calls of a captured step that replayed its graph without running the function",
    "capture_retraces": "calls of a captured step traced again instead of replayed (reasons listed below)",
}
TIMINGS = {
    "trace_s": "host time inside mncore's op dispatch (every thread: autograd's included)",
    "infer_s": "part of trace_s: shape inference of op signatures seen for the first time",
    "compile_s": "host time compiling graphs",
    "execute_s": "time running graphs, measured (on the worker; a performance-mode simulator's jobs are only scheduled, on the submitting thread)",
    "sync_s": "host time cutting graphs in sync(), waits excluded",
    "collect_s": "part of sync_s: collecting the pending graph",
    "lookup_s": "part of sync_s: building the graph key and finding (or compiling) its executable",
    "submit_s": "part of sync_s: handing the job to the worker (or scheduling it), waits excluded",
    "gc_s": "time in Python's garbage collector (any thread)",
    "wait_s": "host time waiting for the worker in sync()",
    "modelled_device_s": "modelled device time of the simulated board",
}
VOCABULARY = {**COUNTERS, **TIMINGS}

_lock = threading.Lock()
_tls = threading.local()
_accumulators: list[dict[str, float]] = []
_fallbacks: Counter = Counter()
_retraces: Counter = Counter()
_gauges: dict[str, Callable[[], int]] = {}


def _new_accumulator() -> dict[str, float]:
    acc = dict.fromkeys(VOCABULARY, 0)
    with _lock:
        _accumulators.append(acc)
    _tls.values = acc
    return acc


def accumulator() -> dict[str, float]:
    """This thread's accumulator. Hot paths add to it directly, reading ``local.values`` first and
    calling this only when the thread has none yet."""
    try:
        return _tls.values
    except AttributeError:
        return _new_accumulator()


local = _tls  # ``metrics.local.values``: this thread's accumulator once ``accumulator()`` made it


def add(name: str, amount: float = 1) -> None:
    """Add ``amount`` to counter or timing ``name`` (a KeyError names an undeclared metric)."""
    try:
        acc = _tls.values
    except AttributeError:
        acc = _new_accumulator()
    try:
        acc[name] += amount
    except KeyError:
        raise KeyError(f"mncore metrics: {name!r} is not a declared metric (see mncore.observe.metrics)") from None


def count_fallback(op_name: str) -> None:
    """Ops the device cannot trace (data-dependent shapes) run eagerly; count them per op."""
    with _lock:
        _fallbacks[op_name] += 1
    add("fallback_ops")


def count_retrace(reason: str) -> None:
    """A captured step was traced again instead of replayed; count it under its reason."""
    with _lock:
        _retraces[reason] += 1
    add("capture_retraces")


def capture_retraces() -> dict[str, int]:
    with _lock:
        return dict(_retraces)


_gc_start: dict[int, float] = {}


def _on_gc(phase: str, info: dict) -> None:
    """``gc.callbacks`` hook: time every collection, whichever thread runs it."""
    ident = threading.get_ident()
    if phase == "start":
        _gc_start[ident] = time.perf_counter()
    elif ident in _gc_start:
        add("gc_s", time.perf_counter() - _gc_start.pop(ident))
        add("gc_collections")


gc.callbacks.append(_on_gc)


def register_gauge(name: str, read: Callable[[], int]) -> None:
    """A value owned elsewhere (live buffers) that ``counters()`` reports as it is now."""
    _gauges[name] = read


def gauge(name: str) -> int:
    return _gauges[name]()


def counters() -> dict[str, float]:
    """All counters and timings (seconds) plus the gauges; a fresh dict each call."""
    with _lock:
        accs = list(_accumulators)
    total = dict.fromkeys(VOCABULARY, 0)
    for acc in accs:
        for k, v in list(acc.items()):
            total[k] += v
    out: dict[str, float] = {k: int(total[k]) for k in COUNTERS}
    out.update({k: float(total[k]) for k in TIMINGS})
    out.update({"live_buffers": _gauges["live_buffers"]()} if "live_buffers" in _gauges else {})
    return out


def fallback_ops() -> dict[str, int]:
    with _lock:
        return dict(_fallbacks)


def reset() -> None:
    with _lock:
        for acc in _accumulators:
            for k in acc:
                acc[k] = 0
        _fallbacks.clear()
        _retraces.clear()


# How the host time splits, for the report: (total, its parts); the rest of a total is shown as "other".
SPLITS = {"trace_s": ("infer_s",), "sync_s": ("collect_s", "lookup_s", "submit_s")}


def report() -> str:
    """The counters as aligned text, timings in milliseconds; parts of a timing are indented under it."""
    c = counters()
    parts = {p for ps in SPLITS.values() for p in ps}
    width = max(len(k) for k in c) + 4
    lines = ["mncore metrics"]
    for k, v in c.items():
        if k in parts:
            continue
        if k.endswith("_s"):
            lines.append(f"  {k:<{width}}  {v * 1e3:12.3f} ms")
            for p in SPLITS.get(k, ()):
                lines.append(f"    {p:<{width - 2}}  {c[p] * 1e3:12.3f} ms")
            if k in SPLITS:
                other = v - sum(c[p] for p in SPLITS[k])
                lines.append(f"    {'other':<{width - 2}}  {other * 1e3:12.3f} ms")
        else:
            lines.append(f"  {k:<{width}}  {v:12d}")
    fb = fallback_ops()
    if fb:
        lines.append("  fallback ops (ran eagerly after an implicit sync):")
        lines += [f"    {name}: {n}" for name, n in sorted(fb.items())]
    rt = capture_retraces()
    if rt:
        lines.append("  capture retraces (why a captured step was traced instead of replayed):")
        lines += [f"    {n:6d}  {why}" for why, n in sorted(rt.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)
