"""Side-by-side timing for the benchmark scripts: blocks of steps alternate between the settings compared.

This machine's load changes from second to second, so settings timed one after the other disagree by
more than the effects measured; blocks that alternate, each setting first in every other block, put
the same noise on all of them.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


def alternate(steps: dict[K, Callable[[int], Any]], blocks: int, per_block: int,
              wait: Callable[[], Any]) -> dict[K, float]:
    """Median seconds per step of each of ``steps`` (name -> ``step(i)``) over ``blocks`` blocks of
    ``per_block`` steps; a block is timed from its first step until ``wait()`` returns after its last
    (a device that runs ahead of the host is waited for: measured wall time)."""
    times: dict[K, list[float]] = {name: [] for name in steps}
    for block in range(blocks):
        order = list(steps) if block % 2 == 0 else list(steps)[::-1]
        for name in order:
            step = steps[name]
            t0 = time.perf_counter()
            for i in range(per_block):
                step(i)
            wait()
            times[name].append((time.perf_counter() - t0) / per_block)
    return {name: statistics.median(v) for name, v in times.items()}
