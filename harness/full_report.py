"""Pass rates of full-tier results per backend and mode, and what fails grouped by cause.

    python -m harness.full_report results/full-*/results.jsonl [--markdown]

A row's ``status`` and ``reason`` name its first failing mode (lazy, then Context, then captured
lazy); ``lazy_captured_status`` is the captured mode's own. A mode that ran after an earlier mode
failed has losses but no verdict of its own in the row: it is counted as ``unjudged``, never as a pass.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

MODES = ("lazy", "context", "lazy_captured")


def mode_status(row: dict, mode: str) -> str:
    """``pass``, a failure status, ``unjudged`` (ran after an earlier mode failed) or ``not run``."""
    if row["status"] in ("eager_fail", "skipped", "timeout", "oom") and not row["reason"].startswith(MODES):
        return row["status"]
    if mode == "lazy_captured" and row.get("lazy_captured_status"):
        return row["lazy_captured_status"]
    failed = next((m for m in MODES if re.match(rf"{m}( vs eager)?:", row["reason"])), None)
    if failed == mode:
        return row["status"]
    if failed is None or MODES.index(failed) > MODES.index(mode):
        return "pass" if row.get(f"{mode}_losses") else "not run"
    return "unjudged" if row.get(f"{mode}_losses") else "not run"


def cause(row: dict) -> str:
    """The failure's cause in a few words: the mode and the exception (or the accuracy verdict) type."""
    reason = row["reason"]
    mode, _, rest = reason.partition(":")
    if " vs eager" in mode:
        return f"{mode.split()[0]}: wrong values"
    kind = re.match(r"\s*([A-Za-z_.]+(?:Error|Exception|Warning)?)", rest)
    return f"{mode}: {kind.group(1) if kind else row['status']}" if mode in MODES else row["status"]


def load(paths: list[Path]) -> list[dict]:
    """The last row of every (model, config, backend) in the results files, in order."""
    rows: dict[tuple, dict] = {}
    for p in paths:
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                rows[(r["model"], r["config"], r["backend"])] = r
    return list(rows.values())


def report(rows: list[dict]) -> str:
    lines = ["| backend | rows | row pass | lazy | Context | captured lazy |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for backend in sorted({r["backend"] for r in rows}):
        mine = [r for r in rows if r["backend"] == backend]
        cells = []
        for mode in MODES:
            n = Counter(mode_status(r, mode) for r in mine)
            cells.append(f"{n['pass']}/{len(mine)} ({n['pass'] / len(mine):.0%})")
        ok = sum(r["status"] == "pass" for r in mine)
        lines.append(f"| {backend} | {len(mine)} | {ok} ({ok / len(mine):.0%}) | " + " | ".join(cells) + " |")
    lines += ["", "| backend | cause of the row's first failure | rows | e.g. |", "| --- | --- | ---: | --- |"]
    for backend in sorted({r["backend"] for r in rows}):
        failed = [r for r in rows if r["backend"] == backend and r["status"] != "pass"]
        by = Counter(cause(r) for r in failed)
        for c, n in by.most_common():
            example = next(r["model"] for r in failed if cause(r) == c)
            lines.append(f"| {backend} | {c} | {n} | {example} |")
    return "\n".join(lines)


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
