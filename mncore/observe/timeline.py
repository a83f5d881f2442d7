"""A bounded record of host-trace, compile and device-execution spans for Chrome/Perfetto."""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path

LANES = {"host": 1, "compile": 2, "device": 3, "worker": 4, "emulator": 5}
_events: deque = deque(maxlen=200_000)
_lock = threading.Lock()
_t0 = time.perf_counter()


def now() -> float:
    return time.perf_counter()


def record(lane: str, name: str, start: float, end: float, **args: object) -> None:
    with _lock:
        _events.append((lane, name, start, end, args))


def events() -> list[tuple]:
    """(lane, name, start_s, end_s, args) tuples in perf_counter seconds."""
    with _lock:
        return list(_events)


def clear() -> None:
    with _lock:
        _events.clear()


def export_chrome_trace(path: str | os.PathLike) -> Path:
    """Write the timeline as Chrome trace-event JSON (one thread lane per kind of work)."""
    pid = os.getpid()
    trace = [
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}}
        for lane, tid in LANES.items()
    ]
    for lane, name, start, end, args in events():
        trace.append({
            "name": name, "ph": "X", "pid": pid, "tid": LANES[lane],
            "ts": (start - _t0) * 1e6, "dur": max(end - start, 0.0) * 1e6, "args": args,
        })
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms"}))
    return path
