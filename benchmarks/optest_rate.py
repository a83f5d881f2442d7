"""Generated op tests per second (``tests/test_generated_ops.py``), measured wall time on pfvm:cpu.

The rows/s of ``pytest -n auto`` over a deterministic sample (``MNCORE_OPTEST_SAMPLE``; 0 = every
row): the whole pytest command's wall time, collection and worker start included.

    python benchmarks/optest_rate.py [--sample 2000] [--workers auto]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pytest_rate(sample: int, workers: str) -> tuple[int, float]:
    """(rows run, wall seconds) of the generated op tests under ``pytest -n workers``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MNCORE_OPTEST_SAMPLE=str(sample))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", workers, "-p", "no:cacheprovider",
                          "tests/test_generated_ops.py", "-k", "test_registry_op"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-500:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|xfailed|xpassed|error)", tail)}
    print(f"pytest: {tail}")
    return sum(counts.values()), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=2000, help="rows (MNCORE_OPTEST_SAMPLE; 0 = all)")
    ap.add_argument("--workers", default="auto", help="pytest -n value")
    a = ap.parse_args()
    rows, wall = pytest_rate(a.sample, a.workers)
    print(f"generated op tests: {rows} rows in {wall:.1f} s with pytest -n {a.workers} = {rows / wall:.1f} rows/s "
          f"(measured wall time, pfvm:cpu, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
