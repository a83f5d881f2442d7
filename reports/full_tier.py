"""Pass rates of full-tier rows per backend and mode, and what fails grouped by cause.

Rows are results rows (``results.jsonl`` of ``harness run --tier full``) or expectations rows
(``ci/expected/full_<backend>.csv``, with ``backend`` added). A row's ``status`` and ``reason`` name its first
failing mode (lazy, then Context, then captured lazy); ``lazy_captured_status`` is the captured mode's own. A
mode that ran after an earlier mode failed has no verdict of its own in the row: it is counted as
``unjudged``, never as a pass.
"""
from __future__ import annotations

import re
from collections import Counter

MODES = ("lazy", "context", "lazy_captured")


def _ran(row: dict, mode: str) -> bool:
    """Whether ``mode`` ran: a results row has its losses; an expectations row (``ci/expected``) keeps no
    losses, and every mode ran unless the row says the model never got that far."""
    key = f"{mode}_losses"
    return bool(row[key]) if key in row else True


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
        return "pass" if _ran(row, mode) else "not run"
    return "unjudged" if _ran(row, mode) else "not run"


def cause(row: dict) -> str:
    """The failure's cause in a few words: the mode and the exception (or the accuracy verdict) type, and
    for an op mncore names (``NotCompilableError: mncore: masked_select at ...``) that op."""
    reason = row["reason"]
    mode, _, rest = reason.partition(":")
    if " vs eager" in mode:
        return f"{mode.split()[0]}: wrong values"
    if mode not in MODES:
        return row["status"]
    kind = re.match(r"\s*([A-Za-z_.]+(?:Error|Exception|Warning)?)", rest)
    op = re.match(r"\s*[A-Za-z_.]+: mncore: ([A-Za-z_][\w.]*) at ", rest)
    return f"{mode}: {kind.group(1) if kind else row['status']}" + (f" ({op.group(1)})" if op else "")


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
