"""The compiler fingerprint: a hash of exactly the sources and constants that shape generated code.

Disk-cache entries carry it, so an entry made by another compiler (or another cost model) is never
loaded, while edits elsewhere (the dump tool, codegen writers, the runtime) keep every entry valid.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

COMPILER_VERSION = "2"
_PKG = Path(__file__).resolve().parents[1]
# What decides the FX graph, its kernels, their formats, the memory plan and the modelled cost.
SOURCES = (
    "graph/fx_build.py", "compile/lowering.py", "compile/passes.py", "compile/fusion.py", "compile/precision.py",
    "compile/memory_plan.py", "compile/pipeline.py", "compile/reinplace.py", "compile/executable.py", "ir/targets.py",
    "compile/value_checks.py",
    "sim/hardware.py", "sim/hardware.json", "sim/cost.py",
)


@functools.lru_cache(maxsize=None)
def _digest(costs_path: str) -> str:
    h = hashlib.sha256()
    for rel in SOURCES:
        h.update(rel.encode() + (_PKG / rel).read_bytes())
    h.update(Path(costs_path).read_bytes())
    return h.hexdigest()[:10]


def compiler_version(costs_path: str) -> str:
    """The version plus the hash of ``SOURCES`` and the cost constants file in use."""
    return f"{COMPILER_VERSION}.{_digest(costs_path)}"
