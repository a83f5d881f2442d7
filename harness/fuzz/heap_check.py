"""glibc's checking allocator for fuzz workers (``harness fuzz --malloc-check``).

A kernel that writes past its buffer damages the heap silently: the process dies later, in whichever
case next touches the damaged memory, and a fresh worker does not reproduce that case's crash (a
"flaky" finding that names the wrong op). glibc's debugging allocator, preloaded with
``MALLOC_CHECK_=3``, puts a check byte after every block that ``malloc`` and its family hand out
(PyTorch's CPU tensors among them; Python's small objects come from its own pools) and verifies it
when the block is freed, so the worker aborts in the case that wrote just past its buffer (usually as
that case frees its tensors); the fresh-worker confirmation and the shrinker then reproduce the crash.
A write that skips the check byte and lands in another block is found only when that block is freed.
"""
from __future__ import annotations

import ctypes.util
import glob
import os

LIBRARY = "c_malloc_debug"  # libc_malloc_debug.so.0, shipped with glibc 2.34 and newer
_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/lib/*-linux-gnu", "/usr/lib/*-linux-gnu")


def _find() -> str | None:
    """The library's name or path: ldconfig's cache first, then the usual directories (a container may have
    no cache)."""
    found = sorted(path for d in _DIRS for path in glob.glob(f"{d}/lib{LIBRARY}.so.0"))
    return ctypes.util.find_library(LIBRARY) or (found[0] if found else None)


def environment() -> dict[str, str]:
    """The variables that give a new process the checking allocator (ahead of any LD_PRELOAD already
    set: the first library to define malloc wins); ValueError naming the fix where glibc lacks it."""
    found = _find()
    if found is None:
        raise ValueError("--malloc-check needs glibc's checking allocator (libc_malloc_debug.so.0, part of glibc "
                         "2.34 and newer), which this system does not have: run without --malloc-check, or on a "
                         "system with glibc 2.34 or newer")
    preload = " ".join(filter(None, [found, os.environ.get("LD_PRELOAD")]))
    # LIBC_FATAL_STDERR_: glibc's complaint goes to stderr (the log) even where a terminal is attached
    return {"LD_PRELOAD": preload, "MALLOC_CHECK_": "3", "LIBC_FATAL_STDERR_": "1"}


def active() -> bool:
    """Whether this process runs under the checking allocator (it is mapped in)."""
    try:
        with open("/proc/self/maps") as maps:
            return f"lib{LIBRARY}" in maps.read()
    except OSError:
        return False
