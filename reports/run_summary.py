"""What ``harness run --tier ...`` says at the end, made from its rows (``ModelRow.to_json()`` records):
one line per model with the status of each mode, the reason of any non-pass in a few words and the
verdict against the expectations file; the same table (with the figures) in ``summary.md`` and
``index.html``, rendered by ``reports.page`` like every other page.

Pure data: the verdicts and step-time changes are computed by ``harness.expectations`` and passed in.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pandas as pd

from reports import page, tables

Record = dict[str, Any]
Key = tuple[str, str, str]  # (model, config, backend)
MODES = (("eager", None), ("lazy", "lazy"), ("captured", "lazy_captured"), ("Context", "context"))
NOT_RUN = "–"
LEGEND = [
    "eager: the reference (eager PyTorch on the CPU); lazy: `.to('mncore')` and `mncore.sync()` per step; captured: "
    "lazy mode with the step wrapped in `mncore.capture` (replayed once two recordings agree); Context: the step "
    "compiled once with the Context API. pass: trained the same as eager (losses and parameters within "
    "tolerance); fail_accuracy: ran but disagreed; fail_to_run: raised; not_compilable: the Context API cannot "
    "hold an op whose output shape depends on values (lazy mode runs it); –: not run (an earlier failure)",
    "expectations: expected = the row matches the checked-in expectations file; new = the file has no row for it; "
    "changed = it differs (listed under the table; a regression or an unexpected improvement fails the run); "
    "not checked: the run was interrupted",
    "lazy ms: median lazy-mode step after the first (measured wall time); vs baseline: lazy and captured step "
    "time against the performance baseline file, informational only (changes under 10 % are noise: single "
    "models swing by 5-10 % on a shared machine)",
]
FIGURES = ["model", "config", "backend", "eager_step_ms", "lazy_step_ms", "context_step_ms", "lazy_context_ratio",
           "lazy_captured_step_ms", "lazy_captured_replays_per_step", "trace_ms", "graphs_per_step",
           "compiles_after_warmup", "implicit_syncs_per_step"]


def short(reason: str, width: int = 80) -> str:
    """A reason in a few words: no source site, no parenthesised detail, no advice after ';'."""
    text = " ".join(str(reason).split()).replace("mncore: ", "")
    text = re.sub(r" at \S+:\d+( in [^\s:]+)?", "", text)
    text = re.split(r" \(|; ", text, maxsplit=1)[0]
    return textwrap.shorten(text, width, placeholder=" …")


def mode_statuses(r: Record) -> dict[str, str]:
    """The status of each mode of a row: its own ``<mode>_status``, '–' where it did not run."""
    out = {"eager": "pass" if r.get("eager_losses") or r.get("eager_step_ms") is not None
           else r["status"] if r["status"] in ("eager_fail", "skipped") else NOT_RUN}
    for label, prefix in MODES[1:]:
        out[label] = r.get(f"{prefix}_status") or NOT_RUN
    return out


def why(r: Record) -> str:
    """The reasons of the row's non-pass modes in a few words each (the cell's own when no mode ran)."""
    parts = [f"{label}: {short(r.get(f'{prefix}_reason') or '')}" for label, prefix in MODES[1:]
             if r.get(f"{prefix}_status") not in (None, "pass")]
    if not parts and r["status"] != "pass":
        parts = [f"{r['status']}: {short(r.get('reason') or '')}"]
    return "; ".join(parts)


def verdict(diffs: list[str] | None) -> str:
    """``expected``, ``new`` or ``changed`` (None: the row was not judged, e.g. an interrupted run)."""
    return "not checked" if diffs is None else "new" if diffs == ["new"] else "expected" if not diffs else "changed"


def status_table(records: list[Record], judged: dict[Key, list[str]], perf: dict[Key, str]) -> pd.DataFrame:
    """One row per model: each mode's status, the expectation verdict, lazy step and its change, why not pass."""
    several = len({r["backend"] for r in records}) > 1
    rows = []
    for r in records:
        key = (r["model"], r["config"], r["backend"])
        rows.append({"model": f"{r['model']}:{r['config']}", **({"backend": r["backend"]} if several else {}),
                     **mode_statuses(r), "expectations": verdict(judged.get(key)),
                     "lazy ms": tables.num(r.get("lazy_step_ms")), "vs baseline": perf.get(key, NOT_RUN),
                     "why not pass": why(r)})
    return pd.DataFrame(rows)


def headline(records: list[Record], judged: dict[Key, list[str]]) -> str:
    """One sentence: how many models passed every mode and how many rows match the expectations."""
    modes = [mode_statuses(r) for r in records]
    full = sum(all(v == "pass" for v in m.values()) for m in modes)
    counts = pd.Series([verdict(judged.get((r["model"], r["config"], r["backend"]))) for r in records]).value_counts()
    others = [f"{r['model']}:{r['config']}" for r, m in zip(records, modes) if not all(v == "pass" for v in m.values())]
    named = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
    verb = "does" if len(others) == 1 else "do"
    return (f"{len(records)} model configs: {full} pass in every mode" + (f", {len(others)} {verb} not ({named})"
                                                                         if others else "")
            + "; expectations: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in ("expected", "new", "changed"))
            + (f", {counts['not checked']} not checked" if "not checked" in counts else ""))


def load(meta: dict[str, Any]) -> str:
    """The machine's load during the run (a busy machine makes every step slower than its baseline)."""
    start, end = meta.get("loadavg_start"), meta.get("loadavg_end")
    if not start:
        return "load average not recorded"
    return f"1-minute load average {start[0]:.2f} at the start" + (f", {end[0]:.2f} at the end" if end else "") + \
        f" on {meta.get('cores', '?')} cores"


def to_text(df: pd.DataFrame) -> str:
    """A left-aligned plain-text table for the terminal."""
    if df.empty:
        return "(no rows)"
    cols = [str(c) for c in df.columns]
    cells = [[str(v) for v in row] for row in df.itertuples(index=False)]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    fmt = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cols)] + [fmt(row) for row in cells])


def figures_table(records: list[Record]) -> pd.DataFrame:
    """The measured figures of every row (step times in ms, ratios, graphs, compiles, syncs)."""
    df = pd.DataFrame(records)
    df = df[[c for c in FIGURES if c in df.columns]]
    return df.map(lambda v: tables.num(v) if isinstance(v, float) else v)


def blocks(records: list[Record], meta: dict[str, Any], judged: dict[Key, list[str]], perf: dict[Key, str],
           problems: list[str], files: dict[str, str], note: str = "") -> list[page.Block]:
    """The run's page: provenance, the status table and its legend, the expectation check, the figures."""
    out: list[page.Block] = [("h1", f"harness run --tier {meta['tier']}")]
    if note:
        out.append(("p", note))
    out += [("p", f"Commit `{meta['commit']}`, torch {meta['torch']}, {meta['machine']}, started {meta['when']}; "
                  f"{meta['steps']} steps per mode, times are measured wall time (step time: the median after the "
                  f"first; captured: after its recording steps); {load(meta)}."),
            ("p", headline(records, judged) + "."),
            ("table", status_table(records, judged, perf)), ("ul", LEGEND),
            ("h2", "Expectation check"), ("ul", problems or ["every row matches its expectations file"]),
            ("h2", "Figures"), ("table", figures_table(records)),
            ("p", "Results files: " + ", ".join(f"{k} `{v}`" for k, v in files.items()) + ".")]
    return out


def write(out_dir: Path, records: list[Record], meta: dict[str, Any], judged: dict[Key, list[str]],
          perf: dict[Key, str], problems: list[str], files: dict[str, str], note: str = "") -> tuple[Path, Path]:
    """``summary.md`` and ``index.html`` in ``out_dir`` (one set of blocks, the report pages' renderers)."""
    b = blocks(records, meta, judged, perf, problems, files, note)
    md, html = out_dir / "summary.md", out_dir / "index.html"
    md.write_text(page.markdown(b))
    html.write_text(page.html_page(b, f"harness run --tier {meta['tier']}"))
    return md, html
