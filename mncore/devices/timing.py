"""Holding a thread until a modelled time: the end of a simulated board's job."""
from __future__ import annotations

import ctypes
import sys
import threading
import time

_slack = threading.local()
_PR_SET_TIMERSLACK = 29


def hold_until(end: float) -> None:
    """Hold the calling thread until ``time.perf_counter() == end`` (a performance-mode job's modelled end).

    Linux lets a sleep overrun by the thread's timer slack, 50 us by default: more than the modelled
    time of a small graph, so a board would look up to 1.5x slower than modelled. A thread that holds
    has its slack set to 1 ns once (``prctl``), which leaves the scheduler's own latency, about 10 us here."""
    left = end - time.perf_counter()
    if left <= 0:
        return
    if not getattr(_slack, "set", False):
        _slack.set = True
        if sys.platform.startswith("linux"):
            try:
                ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
            except (OSError, AttributeError):  # no prctl: the default slack stays
                pass
        left = end - time.perf_counter()
    if left > 0:
        time.sleep(left)
