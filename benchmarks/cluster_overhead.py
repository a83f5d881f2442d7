"""Ray's overhead on one machine: ``harness run --tier models`` with ``--cluster local --jobs N`` and
with ``--cluster ray --jobs N`` (an embedded Ray cluster with N CPUs, started and stopped inside the
command) side by side in one run; prints both MEASURED wall times (the whole command, pfvm:cpu) and
the ratio (target: ray / local <= 1.15), then the simulation on paper of the tier on more nodes from
the Ray run's per-cell times (``reports.cluster_plan``).

Ray may only listen on loopback here, so the script runs itself inside a network namespace that has
only ``lo`` (``harness.netns``; needs root). Neither run has a disk compile cache (both compile alike).

    python benchmarks/cluster_overhead.py [--models mlp_w64:tiny,mlp_w128:tiny] [--jobs 2] [--steps 3]
    python benchmarks/cluster_overhead.py --plan-from results/DIR [--cpus-per-node 2] [--overhead-s 0.5]

A measured run writes both wall times, the ratio, the plan and the provenance to
``docs/cluster-results/results.json`` (``--results``), which ``make figures`` renders into ``docs/figures.md``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from harness import netns
from harness.results import provenance, write_owned_json
from reports import cluster_plan, tables

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "cluster-results" / "results.json"
WRITER = "benchmarks/cluster_overhead.py"
TARGET = 1.15  # ray / local on the models tier (Ray's overhead stays small)


def timed_run(cluster: str, args: argparse.Namespace, out: Path) -> float:
    """Wall seconds of one ``harness run`` (its output to ``out/run.log``)."""
    cmd = [sys.executable, "-m", "harness.cli", "run", "--tier", "models", "--steps", str(args.steps),
           "--jobs", str(args.jobs), "--cluster", cluster, "--out", str(out)]
    if args.models:
        cmd += ["--models", args.models]
    env = {k: v for k, v in os.environ.items() if k not in ("MNCORE_CACHE_DIR", "RAY_ADDRESS")}
    if args.threads:  # Ray gives a 1-CPU task OMP_NUM_THREADS=1; the same for both isolates the cluster's cost
        env["OMP_NUM_THREADS"] = str(args.threads)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with (out.parent / f"{out.name}.log").open("w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if rc not in (0, 1):  # 1: expectation mismatches (a --models subset, a slow machine), still a full run
        raise SystemExit(f"harness run --cluster {cluster} exited {rc}: see {out.parent / f'{out.name}.log'}")
    return wall


def show_plan(results: Path, df: pd.DataFrame, cpus_per_node: int, overhead_s: float) -> pd.DataFrame:
    """Print (and return) the plan on N nodes from the per-cell times ``df`` of the run in ``results``."""
    print(f"\nsimulation on paper from {results} ({len(df)} cells, {df['wall_s'].sum():.0f} s of cell wall time, "
          f"longest {df['wall_s'].max():.0f} s; {cpus_per_node} cells at a time per node, {overhead_s:.2f} s "
          "overhead per cell):")
    table = cluster_plan.plan(df, cpus_per_node, overhead_s)
    print(tables.to_markdown(table))
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="a subset (harness run --models) instead of the whole models tier")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of both runs' cells (default 1, "
                    "what Ray sets for a 1-CPU task; 0: leave it unset, so local cells use every core each)")
    ap.add_argument("--out", type=Path, help="keep both runs' results here (default: a temporary directory)")
    ap.add_argument("--results", type=Path, default=RESULTS, help=f"results file to write (default {RESULTS})")
    ap.add_argument("--plan-from", type=Path, help="only print the plan from this results file or directory")
    ap.add_argument("--cpus-per-node", type=int, default=2)
    ap.add_argument("--overhead-s", type=float, default=None, help="per-cell overhead for the plan "
                    "(default: measured, (ray - local) wall / cells, at least 0)")
    args = ap.parse_args()
    if args.plan_from:
        show_plan(args.plan_from, cluster_plan.cells(args.plan_from), args.cpus_per_node, args.overhead_s or 0.0)
        return 0
    if not netns.inside():
        why = netns.unavailable()
        if why:
            print(f"cluster_overhead: cannot keep Ray on loopback here: {why}", file=sys.stderr)
            return 2
        return subprocess.call(netns.wrap([sys.executable, *sys.argv]), cwd=ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        local = timed_run("local", args, root / "local")
        ray = timed_run("ray", args, root / "ray")
        cells = cluster_plan.cells(root / "ray")
        n = len(cells)
        threads = f"OMP_NUM_THREADS={args.threads}" if args.threads else "OMP_NUM_THREADS unset (Ray sets 1)"
        print(f"harness run --tier models{' --models ' + args.models if args.models else ''} --steps {args.steps} "
              f"--jobs {args.jobs} ({n} cells, pfvm:cpu, {threads}, measured wall time of the whole command):")
        print(f"  --cluster local: {local:7.1f} s")
        print(f"  --cluster ray:   {ray:7.1f} s   (embedded Ray cluster, {args.jobs} CPUs, started and stopped in it)")
        print(f"  ray / local: {ray / local:.3f} (target <= {TARGET})")
        overhead = args.overhead_s if args.overhead_s is not None else max(0.0, (ray - local) / n)
        table = show_plan(root / "ray", cells, args.cpus_per_node, overhead)
        write_owned_json(args.results, {
            **provenance(), "loadavg_end": list(os.getloadavg()), "command": " ".join(["python", WRITER, *sys.argv[1:]]),
            "models": args.models or "the models tier", "jobs": args.jobs, "steps": args.steps, "threads": threads,
            "cells": n, "local_s": round(local, 1), "ray_s": round(ray, 1), "ratio": round(ray / local, 3),
            "target": TARGET, "cell_wall_s": round(float(cells["wall_s"].sum()), 1),
            "longest_cell_s": round(float(cells["wall_s"].max()), 1), "cpus_per_node": args.cpus_per_node,
            "overhead_s": round(overhead, 2), "plan": table.to_dict(orient="records")}, WRITER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
