"""glibc's checking allocator for fuzz workers (``harness fuzz --malloc-check``).

A kernel that writes past its buffer damages the heap silently: the process dies later, in whichever
case next touches the damaged memory, and a fresh worker does not reproduce that case's crash (a
"flaky" finding that names the wrong op). glibc's debugging allocator, preloaded with
``MALLOC_CHECK_=3``, puts a check byte after every allocation and verifies it when the block is
freed, so the worker aborts in the case that wrote past its buffer (usually as that case frees its
tensors); the fresh-worker confirmation and the shrinker then reproduce the crash.
"""
from __future__ import annotations

import ctypes.util
import os

LIBRARY = "c_malloc_debug"  # libc_malloc_debug.so.0, shipped with glibc 2.34 and newer


def environment() -> dict[str, str]:
    """The variables that give a new process the checking allocator (ahead of any LD_PRELOAD already
    set: the first library to define malloc wins); ValueError naming the fix where glibc lacks it."""
    found = ctypes.util.find_library(LIBRARY)
    if found is None:
        raise ValueError("--malloc-check needs glibc's checking allocator (libc_malloc_debug.so.0, part of glibc "
                         "2.34 and newer), which this system does not have: run without --malloc-check, or on a "
                         "system with glibc 2.34 or newer")
    preload = " ".join(filter(None, [found, os.environ.get("LD_PRELOAD")]))
    return {"LD_PRELOAD": preload, "MALLOC_CHECK_": "3"}
