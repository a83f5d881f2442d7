"""``Latch``, the one-shot event every submitted job's outputs share."""
from __future__ import annotations

import threading
import time

import pytest

from mncore.ir.latch import Latch


def test_latch_blocks_until_set_then_lets_every_waiter_through() -> None:
    latch = Latch()
    assert not latch.is_set() and latch.wait(timeout=0.01) is False
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(latch.wait())) for _ in range(4)]
    for t in waiters:
        t.start()
    latch.set()
    latch.set()  # idempotent: the worker sets it once per output
    for t in waiters:
        t.join(timeout=10)
    assert woke == [True] * 4 and latch.is_set() and latch.wait() and latch.wait(timeout=0)


def test_latch_set_at_a_modelled_time_holds_each_waiter_until_then() -> None:
    """Jobs the executor schedules without the worker (performance mode) have outputs ready at their
    modelled end: no thread sets the latch, the clock does."""
    held: list[float] = []
    latch = Latch()
    end = time.perf_counter() + 0.05
    latch.set_at(end, lambda t: (held.append(t), time.sleep(max(t - time.perf_counter(), 0))))
    assert latch.wait() and time.perf_counter() >= end and held == [end]
    assert latch.is_set()
    far = Latch()
    far.set_at(time.perf_counter() + 3600, lambda t: pytest.fail("a timed-out wait must not hold"))
    assert not far.is_set() and far.wait(timeout=0.01) is False
