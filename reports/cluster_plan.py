"""A simulation on paper: how long a ``harness run`` would take on N cluster nodes, from the measured
wall time of each of its cells (``wall_s`` of the rows of a ``results.jsonl``).

Cells are handed to free CPU slots in the order the harness submits them (as Ray's scheduler takes
them), each paying ``overhead_s`` (scheduling, worker and result transfer; measured by
``benchmarks/cluster_overhead.py``). A warm shared compile cache (``MNCORE_CACHE_DIR`` on a shared
filesystem, after one run) removes each cell's lazy compile time. The lower bound is the longer of the
longest cell and the total work spread evenly: where the plan meets the longest cell, more nodes no
longer help and the bottleneck is that cell.
"""
from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Sequence

import pandas as pd

NODES = (1, 2, 4, 8, 16, 32, 64)


def cells(results: Path) -> pd.DataFrame:
    """One row per cell of a ``harness run`` results file: model, config, backend, ``wall_s`` and
    ``compile_s`` (its lazy compile time; 0 where it has none)."""
    path = results / "results.jsonl" if results.is_dir() else results
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows or any(r.get("wall_s") is None for r in rows):
        raise ValueError(f"{path}: no rows with wall_s (a harness run results file is needed)")
    df = pd.DataFrame(rows)
    compile_s = df["lazy_compile_s"] if "lazy_compile_s" in df else pd.Series(0.0, index=df.index)
    return pd.DataFrame({"model": df["model"], "config": df["config"], "backend": df["backend"],
                         "wall_s": df["wall_s"].astype(float), "compile_s": compile_s.fillna(0.0).astype(float)})


def makespan(times: Sequence[float], slots: int) -> float:
    """The end of the last cell when each goes, in order, to the slot that frees first."""
    free = [0.0] * max(1, slots)
    for t in times:
        heapq.heappush(free, heapq.heappop(free) + t)
    return max(free)


def plan(df: pd.DataFrame, cpus_per_node: int = 2, overhead_s: float = 0.0,
         nodes: Sequence[int] = NODES) -> pd.DataFrame:
    """The table: per node count, the simulated wall time with a cold and a warm shared cache, the
    lower bound, and the speed-up over one node (cold)."""
    cold = list(df["wall_s"] + overhead_s)
    warm = list((df["wall_s"] - df["compile_s"]).clip(lower=0.0) + overhead_s)
    out = []
    for n in nodes:
        slots = n * cpus_per_node
        c, w = makespan(cold, slots), makespan(warm, slots)
        out.append({"nodes": n, "slots": slots, "cold_cache_s": c, "warm_cache_s": w,
                    "lower_bound_s": max(max(cold), sum(cold) / slots), "speedup": makespan(cold, cpus_per_node) / c,
                    "bound_by": "longest cell" if c <= 1.05 * max(cold) else "total work"})
    return pd.DataFrame(out).round({"cold_cache_s": 1, "warm_cache_s": 1, "lower_bound_s": 1, "speedup": 2})

