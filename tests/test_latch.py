"""``Latch``, the one-shot event every submitted job's outputs share."""
from __future__ import annotations

import threading

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
