"""Exclusive locks on simulated MN-Core 2 boards, one lock file per board under a runtime directory.

A process holds at most one board, from ``init`` until it switches device or exits (the OS drops
the lock of a process that dies). ``mncore2:auto`` takes the first free board; a process asking
for a busy board waits up to ``MNCORE_LOCK_TIMEOUT`` seconds (default 600, as MLSDK) and then
raises :class:`BoardLockTimeout` naming the board and the holder's process id.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import filelock

from mncore import config
from mncore.errors import BoardLockTimeout


def runtime_dir() -> Path:
    return config.ensure_directory(config.runtime_dir(), "the board lock directory (MNCORE_RUNTIME_DIR)",
                                   "set MNCORE_RUNTIME_DIR to a writable directory")


@dataclass(eq=False)
class Board:
    index: int
    lock: filelock.BaseFileLock

    @property
    def name(self) -> str:
        return f"mncore2:{self.index}"

    def release(self) -> None:
        pid_file = _pid_file(self.index)
        try:
            if pid_file.read_text().strip() == str(os.getpid()):
                pid_file.unlink()
        except OSError:
            pass
        self.lock.release(force=True)


def _pid_file(index: int) -> Path:
    return runtime_dir() / f"board{index}.pid"


def holder(index: int) -> str:
    """The process id recorded by the board's current holder ('unknown' if none was written)."""
    try:
        return _pid_file(index).read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _try(index: int, timeout: float) -> Board | None:
    lock = filelock.FileLock(str(runtime_dir() / f"board{index}.lock"), thread_local=False)
    try:
        lock.acquire(timeout=timeout)
    except filelock.Timeout:
        return None
    _pid_file(index).write_text(str(os.getpid()))
    return Board(index, lock)


def acquire(which: str) -> Board:
    """Lock board ``which`` ('auto' or a board number), waiting up to the lock timeout."""
    n = config.get("sim_boards")
    if which != "auto":
        index = int(which)
        if index >= n:
            raise ValueError(f"device 'mncore2:{index}' does not exist: this host has {n} simulated board(s) "
                             f"(MNCORE_SIM_BOARDS={n}); valid: mncore2:auto, "
                             + ", ".join(f"mncore2:{i}" for i in range(n)))
        candidates = [index]
    else:
        candidates = list(range(n))
    timeout = config.get("lock_timeout")
    deadline = time.monotonic() + timeout
    next_note = time.monotonic() + 10.0
    while True:
        for i in candidates:
            board = _try(i, 0)
            if board is not None:
                return board
        now = time.monotonic()
        if now >= deadline:
            held = ", ".join(f"mncore2:{i} by process {holder(i)}" for i in candidates)
            raise BoardLockTimeout(f"mncore: timed out after {timeout:g} s waiting for a free board "
                                   f"(MNCORE_LOCK_TIMEOUT); locked: {held}")
        if now >= next_note:
            print(f"mncore: waiting for {'a free board' if which == 'auto' else f'mncore2:{which}'} "
                  f"({', '.join(f'mncore2:{i} held by process {holder(i)}' for i in candidates)})", file=sys.stderr)
            next_note = now + 10.0
        time.sleep(min(0.05, max(deadline - now, 0.0)))
