"""Running jobs on the simulated devices (``emu2``, ``mncore2:N``): DRAM accounting, modelled time.

``functional`` mode computes values with the kernel-program emulator and records the modelled
device time without waiting for it; ``performance`` mode skips the numerics (outputs are left
uninitialised) and holds the worker for the modelled time, so that the overlap of host tracing
and device execution behaves like the modelled board.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from mncore.compiler.precision import storage_bytes
from mncore.devices import board as boards
from mncore.runtime import buffers
from mncore.runtime.state import settings
from mncore.sim.cost import cost_model
from mncore.sim.hardware import hardware


class DeviceOutOfMemoryError(MemoryError):
    """A graph's memory plan does not fit the device DRAM left free by live tensors."""


_board: list[boards.Board | None] = [None]


def attach(name: str) -> str:
    """Take the board ``name`` asks for (keeping one already held); returns the concrete device name."""
    held = _board[0]
    if name.startswith("mncore2:"):
        which = name.split(":", 1)[1]
        if held is not None and (which == "auto" or int(which) == held.index):
            return held.name
        new = boards.acquire(which)  # a failure here leaves the board we hold untouched
        detach()
        _board[0] = new
        return new.name
    detach()
    return name


def detach() -> None:
    if _board[0] is not None:
        _board[0].release()
        _board[0] = None


def check_memory(exe: Any) -> None:
    """Raise when the plan's peak exceeds DRAM minus what other live device tensors hold.

    Checked on every submission (a cached graph can stop fitting when other tensors grow);
    the buffer table keeps a running byte total, so this costs O(1).
    """
    capacity = hardware().dram_bytes
    resident = max(buffers.live_bytes() - exe.stats.get("input_host_bytes", 0), 0)
    free = max(capacity - resident, 0)
    need = exe.plan.peak_bytes
    if need > free:
        raise DeviceOutOfMemoryError(
            f"mncore: graph {exe.name} needs {need:,} bytes of device DRAM (peak of its memory plan) but "
            f"{settings.device} has {free:,} bytes free ({capacity:,} total, {resident:,} held by other live "
            f"tensors); reduce the batch size or free tensors (MNCORE_SIM_DRAM_BYTES sets the board size)")


def upload_bytes(leaves: list) -> int:
    """Bytes of inputs that reach the board for the first time (host data, new parameters)."""
    n = 0
    for leaf in leaves:
        if not leaf.on_board:
            leaf.on_board = True
            if leaf.graph is None:
                n += storage_bytes(leaf.meta, settings.float_dtype)
    return n


class DeviceQueue:
    """The modelled board's in-order job queue: a job starts when it was submitted and the previous
    job has finished on the device, and runs for its modelled time. Host-side runtime work (the
    worker preparing the next job) overlaps with the device's busy time, as on real hardware."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def schedule(self, submitted: float, modelled: float) -> tuple[float, float]:
        start = max(submitted, self.free_at)
        self.free_at = start + modelled
        return start, self.free_at


queue = DeviceQueue()


def execute(exe: Any, leaves: list, args: list, submitted: float) -> tuple[Any, float, float, float]:
    """Run one job; returns its outputs, modelled device time and modelled (start, end) on the
    ``time.perf_counter`` clock. Performance mode returns at the modelled end."""
    modelled = exe.modelled_s + cost_model().transfer(upload_bytes(leaves))
    start, end = queue.schedule(submitted, modelled)
    if settings.sim_mode == "performance":
        outs = tuple(torch.empty_strided(m[0], m[1], dtype=m[2]) for m in exe.output_metas)
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return outs, modelled, start, end
    return exe.fn(*args), modelled, start, end
