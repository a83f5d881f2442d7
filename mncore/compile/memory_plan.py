"""Liveness-based placement of every DRAM-resident value (inputs, kernel outputs) of a program.

Values are placed in kernel order with a first-fit free list: inputs first (they stay resident
for the whole job: they are the caller's parameters and data), then each kernel's outputs; a
value's range is returned to the free list after the last kernel that reads it, so a later
kernel's outputs can reuse it. Graph outputs are never freed. The plan's peak is its high-water
mark, the address one past the highest byte any value occupies.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

ALIGN = 64


@dataclass(frozen=True)
class Placement:
    name: str
    start: int
    size: int
    first: int  # kernel index that writes it (-1: a program input)
    last: int   # last kernel index that reads it (n_kernels: alive at the end)

    @property
    def end(self) -> int:
        return self.start + self.size

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dram": f"DRAM@{self.start}-{self.end}", "bytes": self.size,
                "live": [self.first, self.last]}


@dataclass
class MemoryPlan:
    placements: list[Placement]
    peak_bytes: int
    live_peak_bytes: int

    def describe(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "live_peak_bytes": self.live_peak_bytes,
                "alignment": ALIGN, "values": [p.describe() for p in self.placements]}


class _FreeList:
    """Sorted, coalesced holes below the high-water mark."""

    def __init__(self) -> None:
        self.holes: list[tuple[int, int]] = []  # (start, size)
        self.top = 0

    def alloc(self, size: int) -> int:
        for i, (start, hole) in enumerate(self.holes):
            if hole >= size:
                if hole == size:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + size, hole - size)
                return start
        if self.holes and self.holes[-1][0] + self.holes[-1][1] == self.top:
            start = self.holes.pop()[0]
        else:
            start = self.top
        self.top = start + size
        return start

    def free(self, start: int, size: int) -> None:
        if size == 0:
            return
        i = bisect.bisect(self.holes, (start, size))
        self.holes.insert(i, (start, size))
        if i + 1 < len(self.holes) and start + size == self.holes[i + 1][0]:
            size += self.holes.pop(i + 1)[1]
            self.holes[i] = (start, size)
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:
            prev = self.holes.pop(i - 1)
            self.holes[i - 1] = (prev[0], prev[1] + size)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(values: list[tuple[str, int, int, int]], n_kernels: int) -> MemoryPlan:
    """Place ``(name, bytes, first_kernel, last_kernel)`` values; inputs have ``first == -1``."""
    fl = _FreeList()
    by_first: dict[int, list] = {}
    by_last: dict[int, list] = {}
    for v in values:
        by_first.setdefault(v[2], []).append(v)
    placements: list[Placement] = []
    live = live_peak = 0
    for step in range(-1, n_kernels):
        for name, size, first, last in by_first.get(step, ()):
            size = _aligned(size)
            p = Placement(name, fl.alloc(size), size, first, last)
            placements.append(p)
            if last < n_kernels:
                by_last.setdefault(max(last, step), []).append(p)
            live += size
        live_peak = max(live_peak, live)
        for p in by_last.pop(step, ()):
            fl.free(p.start, p.size)
            live -= p.size
    return MemoryPlan(placements, fl.top, live_peak)
