"""Pass rates of full-tier results per backend and mode, and what fails grouped by cause.

    python -m harness.full_report results/full-*/results.jsonl

The counting is ``reports.full_tier`` (``make figures`` renders the same tables from ``ci/expected``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reports.full_tier import report


def load(paths: list[Path]) -> list[dict]:
    """The last row of every (model, config, backend) in the results files, in order."""
    rows: dict[tuple, dict] = {}
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[(r["model"], r["config"], r["backend"])] = r
    return list(rows.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pass rates of full-tier results per backend and mode")
    ap.add_argument("results", nargs="+", type=Path, help="results.jsonl files of harness run --tier full")
    a = ap.parse_args(argv)
    missing = [str(p) for p in a.results if not p.is_file()]
    if missing:
        print(f"harness.full_report: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    print(report(load(a.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
