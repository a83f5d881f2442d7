"""One registry for every counter and timing the runtime keeps."""
from __future__ import annotations

import threading
from collections import Counter

COUNTERS = (
    "traced_ops", "graphs_executed", "compiles", "cache_hits", "implicit_syncs", "fallback_ops",
    "syncs", "bytes_to_device", "bytes_to_host", "disk_cache_hits", "disk_cache_misses", "disk_cache_corrupt",
)
TIMINGS = ("trace_s", "compile_s", "execute_s", "sync_s", "wait_s", "modelled_device_s")

_lock = threading.Lock()
_values: Counter = Counter()
_fallbacks: Counter = Counter()


def add(name: str, amount: float = 1) -> None:
    with _lock:
        _values[name] += amount


def count_fallback(op_name: str) -> None:
    """Ops the device cannot trace (data-dependent shapes) run eagerly; count them per op."""
    with _lock:
        _fallbacks[op_name] += 1
        _values["fallback_ops"] += 1


def counters() -> dict[str, float]:
    """All counters and timings (seconds) plus ``live_buffers``; a fresh dict each call."""
    from mncore.runtime import buffers

    with _lock:
        out = {k: int(_values[k]) for k in COUNTERS}
        out.update({k: float(_values[k]) for k in TIMINGS})
        out.update({k: v for k, v in _values.items() if k not in out})
    out["live_buffers"] = buffers.live()
    return out


def fallback_ops() -> dict[str, int]:
    with _lock:
        return dict(_fallbacks)


def reset() -> None:
    with _lock:
        _values.clear()
        _fallbacks.clear()


def report() -> str:
    """The counters as aligned text, timings in milliseconds."""
    c = counters()
    width = max(len(k) for k in c)
    lines = ["mncore metrics"]
    for k, v in c.items():
        if k.endswith("_s"):
            lines.append(f"  {k:<{width}}  {v * 1e3:12.3f} ms")
        else:
            lines.append(f"  {k:<{width}}  {v:12d}" if isinstance(v, int) else f"  {k:<{width}}  {v}")
    fb = fallback_ops()
    if fb:
        lines.append("  fallback ops (ran eagerly after an implicit sync):")
        lines += [f"    {name}: {n}" for name, n in sorted(fb.items())]
    return "\n".join(lines)
