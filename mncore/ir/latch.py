"""``Latch``: a one-shot event for "this job's outputs exist", made once per submitted graph.

A ``threading.Event`` is a condition variable plus a lock and costs several microseconds to make; a
replayed or Context step makes one per job, on the host's critical path. A latch is one held lock:
``set`` releases it once, ``wait`` takes and returns it. Only the worker that runs the job sets it,
or, for a job the executor schedules without the worker (a device that only models time), the job's
modelled end does: ``set_at`` before anyone waits, and ``wait`` holds the caller until that time.
"""
from __future__ import annotations

import threading
import time
from typing import Callable


class Latch:
    """Starts unset; ``set()`` (idempotent, from one thread) lets every present and future ``wait()`` through."""

    __slots__ = ("_lock", "_set", "_at", "_hold")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False
        self._at: float | None = None
        self._hold: Callable[[float], None] | None = None

    def set_at(self, end: float, hold: Callable[[float], None]) -> None:
        """Set at ``time.perf_counter() == end``: a waiter is held by ``hold(end)`` until then. Called once,
        by the thread that submits the job, before the latch is shared."""
        self._at, self._hold = end, hold

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set or (self._at is not None and time.perf_counter() >= self._at)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (or ``timeout`` seconds); True once set."""
        if self._set:
            return True
        if self._at is not None:
            if timeout is not None and self._at - time.perf_counter() > timeout:
                time.sleep(max(timeout, 0.0))
                return False
            self._hold(self._at)
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._lock.release()
        return True
