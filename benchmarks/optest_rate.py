"""Generated op tests per second (``tests/test_generated_ops.py``), measured wall time on pfvm:cpu.

The rows/s of ``pytest -n auto`` over a deterministic sample (``MNCORE_OPTEST_SAMPLE``; 0 = every
row): the whole pytest command's wall time, collection and worker start included. Beside it, in the
same run: the collection alone (``pytest --collect-only``), and with ``--per-row`` the same rows with a
test item per row (``MNCORE_OPTEST_BATCH=1``, the layout before rows were grouped), so the ratio is
measured side by side. A run writes its figures, the registry's size and the provenance to
``docs/conformance-results/optest_rate.json`` (``--results``), which ``make figures`` renders into
``docs/figures.md``.

    python benchmarks/optest_rate.py [--sample 2000] [--workers auto] [--per-row] [--results PATH]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "conformance-results" / "optest_rate.json"
WRITER = "benchmarks/optest_rate.py"
TARGET = 40.0  # rows per second with pytest -n auto on the 2-core CI machine


def pytest_wall(sample: int, workers: str, batch: int | None, collect_only: bool = False) -> tuple[float, str]:
    """(wall seconds, pytest's summary line) of the generated op tests under ``pytest -n workers``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MNCORE_OPTEST_SAMPLE=str(sample))
    if batch is not None:
        env["MNCORE_OPTEST_BATCH"] = str(batch)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_generated_ops.py",
           "-k", "test_registry_op"] + (["--collect-only"] if collect_only else ["-n", workers])
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = out.stdout.strip().splitlines()
    tail = lines[-1] if lines else out.stderr[-500:]
    if out.returncode != 0 and not collect_only:
        failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        print("\n".join(failed[:20]), file=sys.stderr)
    return wall, tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=2000, help="rows (MNCORE_OPTEST_SAMPLE; 0 = all)")
    ap.add_argument("--workers", default="auto", help="pytest -n value")
    ap.add_argument("--per-row", action="store_true", help="also run the same rows with a test item per row")
    ap.add_argument("--results", type=Path, default=RESULTS, help=f"results file to write (default {RESULTS})")
    a = ap.parse_args()
    from harness import optests
    from harness.results import provenance, write_owned_json

    start = provenance()
    rows = len(optests.rows(a.sample))
    where = f"measured wall time, pfvm:cpu, {os.cpu_count()} cores"
    wall, tail = pytest_wall(a.sample, a.workers, None, collect_only=True)
    print(f"collection: {tail} in {wall:.1f} s ({where})")
    runs = [("rows grouped per op (MNCORE_OPTEST_BATCH default)", None)] + \
        ([("a test item per row (MNCORE_OPTEST_BATCH=1)", 1)] if a.per_row else [])
    collection = {"wall_s": round(wall, 1), "pytest": tail}
    rates, measured = [], []
    for label, batch in runs:
        wall, tail = pytest_wall(a.sample, a.workers, batch)
        rates.append(rows / wall)
        measured.append({"layout": label, "batch": batch, "wall_s": round(wall, 1), "rows_per_s": round(rates[-1], 1),
                         "pytest": tail})
        print(f"{label}: pytest: {tail}")
        print(f"generated op tests: {rows} rows in {wall:.1f} s with pytest -n {a.workers} = {rates[-1]:.1f} rows/s "
              f"({where})")
    if len(rates) == 2:
        print(f"grouped / per-row: {rates[0] / rates[1]:.2f}x rows/s (same rows, same run)")
    registry = optests.rows(0)  # every row, from the load the sample above already made
    write_owned_json(a.results, {
        **start, "loadavg_end": list(os.getloadavg()), "command": " ".join(["python", WRITER, *sys.argv[1:]]),
        "sample": a.sample, "rows": rows, "registry_rows": len(registry),
        "registry_ops": len({e.op for e in registry}),
        "workers": a.workers, "time": where, "collection": collection, "runs": measured, "target_rows_per_s": TARGET,
    }, WRITER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
