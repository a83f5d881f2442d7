"""``Latch``: a one-shot event for "this job's outputs exist", made once per submitted graph.

A ``threading.Event`` is a condition variable plus a lock and costs several microseconds to make; a
replayed or Context step makes one per job, on the host's critical path. A latch is one held lock:
``set`` releases it once, ``wait`` takes and returns it. Only the worker that runs the job sets it.
"""
from __future__ import annotations

import threading


class Latch:
    """Starts unset; ``set()`` (idempotent, from one thread) lets every present and future ``wait()`` through."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (or ``timeout`` seconds); True once set."""
        if self._set:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._lock.release()
        return True
