"""The checked-in expectations of the tiers (``ci/expected/<tier>_<backend>.csv``: status, graphs and
compiles per model, and the captured mode's status and replays per step) and their performance
baselines (``perf_<tier>_<backend>.csv``).

Both files are read through one validating reader, so a corrupt file is refused with one line naming
it (``ExpectationsError``) before any model runs, never judged row by row into false verdicts; and an
update replaces only the rows of the cells that ran, so a partial run cannot delete the others.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from reports.schema import ModelRow

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_DIR = ROOT / "ci" / "expected"
KEY = ["model", "config"]
EXPECTED_COLUMNS = KEY + ["status", "graphs_per_step", "compiles_after_warmup", "lazy_captured_status",
                          "lazy_captured_replays_per_step", "reason"]
PERF_COLUMNS = KEY + ["backend", "eager_step_ms", "lazy_step_ms", "context_step_ms", "trace_ms",
                      "lazy_captured_step_ms"]
# Columns added after files were checked in: a file without them reads them as '' (not measured)
OPTIONAL = {"lazy_captured_status", "lazy_captured_replays_per_step", "lazy_captured_step_ms", "reason"}
REASONED = ("not_compilable",)  # statuses whose reason is expected too (other reasons hold measured numbers)
INTEGERS = ["graphs_per_step", "compiles_after_warmup"]
STATUSES = ["status", "lazy_captured_status"]
TIMED_MODES = ("lazy", "lazy_captured")  # whose step-time changes are reported against the baseline
PERF_NOISE = 0.10  # single models swing by 5-10 % here: smaller changes are reported as noise
Records = dict[tuple[str, str], dict[str, str]]


class ExpectationsError(ValueError):
    """An expectations or baseline file that cannot be trusted; the message names it and the fix."""


def expected_path(tier: str, backend: str) -> Path:
    return EXPECTED_DIR / f"{tier}_{backend.replace(':', '_')}.csv"


def perf_path(tier: str, backend: str) -> Path:
    return EXPECTED_DIR / f"perf_{tier}_{backend.replace(':', '_')}.csv"


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it (as messages name files)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _refuse(path: Path, problem: str) -> ExpectationsError:
    return ExpectationsError(f"{shown(path)}: {problem}; restore it (git checkout -- {shown(path)}) or delete it "
                             "and regenerate it with --update-expected")


def _is_int(text: str) -> bool:
    return text == "" or text.lstrip("-").isdigit()


def _is_number(text: str) -> bool:
    try:
        float(text or 0)
    except ValueError:
        return False
    return True


def _read(path: Path, columns: list[str]) -> Records:
    """The rows of ``path`` by (model, config), all values as text; {} when there is no file."""
    import pandas as pd

    if not path.exists():
        return {}
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise _refuse(path, f"not a readable CSV ({str(e).strip().splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns and c not in OPTIONAL]
    if missing:
        raise _refuse(path, f"missing column(s) {', '.join(missing)}")
    for c in columns:
        if c not in df.columns:
            df[c] = ""
    out: Records = {}
    for line, r in enumerate(df.to_dict("records"), 2):
        key = (r["model"], r["config"])
        if not all(key):
            raise _refuse(path, f"line {line} has no model or config")
        if key in out:
            raise _refuse(path, f"line {line} repeats {key[0]}:{key[1]}")
        out[key] = {c: r[c] for c in columns}
    return out


def load_expected(tier: str, backend: str) -> Records:
    """The expectations of ``tier`` on ``backend`` (validated: statuses, integer counts, replays per step)."""
    path = expected_path(tier, backend)
    records = _read(path, EXPECTED_COLUMNS)
    for (m, c), r in records.items():
        for col in STATUSES:
            unset = col != "status" and r[col] == ""  # the captured mode did not run (e.g. eager failed)
            if r[col] not in ModelRow.STATUSES and not unset:
                raise _refuse(path, f"{m}:{c} has {col} {r[col]!r}, not one of {', '.join(ModelRow.STATUSES)}")
        bad = [col for col in INTEGERS if not _is_int(r[col])]
        if bad:
            raise _refuse(path, f"{m}:{c} has a non-integer {bad[0]} {r[bad[0]]!r}")
        if not _is_number(r["lazy_captured_replays_per_step"]):
            raise _refuse(path, f"{m}:{c} has a non-numeric lazy_captured_replays_per_step "
                                f"{r['lazy_captured_replays_per_step']!r}")
    return records


def load_perf(tier: str, backend: str) -> Records:
    """The performance baseline of ``tier`` on ``backend`` (validated: numeric step times)."""
    path = perf_path(tier, backend)
    records = _read(path, PERF_COLUMNS)
    for (m, c), r in records.items():
        bad = [col for col in PERF_COLUMNS[3:] if not _is_number(r[col])]
        if bad:
            raise _refuse(path, f"{m}:{c} has a non-numeric {bad[0]} {r[bad[0]]!r}")
    return records


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _expected(row: dict[str, Any], col: str) -> str:
    """What ``row`` puts in column ``col`` of an expectations file."""
    if col == "reason" and row.get("status") not in REASONED:
        return ""
    return _text(row.get(col))


def judge(rows: list[dict[str, Any]], tier: str, backend: str) -> dict[tuple[str, str], list[str]]:
    """Per (model, config) of ``rows`` on ``backend``: [] when it matches the checked-in expectations,
    ``["new"]`` when the file has no row for it (or there is no file), else its differences
    (``status 'pass' -> 'fail_to_run' (regression)``: regressions and unexpected improvements alike)."""
    want = load_expected(tier, backend)
    out: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r["backend"] != backend:
            continue
        key = (r["model"], r["config"])
        e = want.get(key)
        if e is None:
            out[key] = ["new"]
            continue
        out[key] = []
        for col in EXPECTED_COLUMNS[2:]:
            g = _expected(r, col)
            if g != e[col]:
                kind = "change" if col not in STATUSES else "improvement" if g == "pass" else "regression"
                out[key].append(f"{col} {e[col]!r} -> {g!r} ({kind})")
    return out


def check(rows: list[dict[str, Any]], tier: str, backend: str) -> list[str]:
    """Differences from the checked-in expectations (regressions and unexpected improvements alike),
    each naming the file it was judged against."""
    path = expected_path(tier, backend)
    if not path.exists():
        return [f"no expected-results file {shown(path)}"]
    problems = []
    for (m, c), diffs in judge(rows, tier, backend).items():
        problems += [f"{path.name}: {m}:{c}: " + ("not in the file (new model)" if d == "new" else d) for d in diffs]
    ran = {(r["model"], r["config"]) for r in rows if r["backend"] == backend}
    problems += [f"{path.name}: {m}:{c}: expected but not run" for m, c in load_expected(tier, backend) if (m, c) not in ran]
    return problems


def _write(path: Path, columns: list[str], records: Records) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([records[k] for k in sorted(records)], columns=columns).to_csv(path, index=False)


def update(rows: list[dict[str, Any]], tier: str, backend: str, keep_others: bool = True) -> list[Path]:
    """Replace the rows of the cells that ran (status, graphs, compiles; and their performance
    baseline); every other row of both files is kept, or with ``keep_others=False`` (the whole tier
    ran) dropped: a model no longer in the tier would otherwise stay expected and fail the next run."""
    rows = [r for r in rows if r["backend"] == backend]
    expected, perf = load_expected(tier, backend), load_perf(tier, backend)  # refuse a corrupt file first
    if not keep_others:
        expected, perf = {}, {}
    for r in rows:
        key = (r["model"], r["config"])
        expected[key] = {c: _expected(r, c) for c in EXPECTED_COLUMNS}
        perf[key] = {c: _text(r.get(c)) for c in PERF_COLUMNS}
    _write(expected_path(tier, backend), EXPECTED_COLUMNS, expected)
    _write(perf_path(tier, backend), PERF_COLUMNS, perf)
    return [expected_path(tier, backend), perf_path(tier, backend)]


def perf_changes(rows: list[dict[str, Any]], tier: str, backend: str) -> dict[tuple[str, str], str]:
    """Per (model, config): its lazy and captured lazy step times against the stored baseline, e.g.
    ``lazy +4 % (noise), captured -21 % (faster)``; never a failure, changes under PERF_NOISE are noise.
    Models without a baseline on ``backend`` are left out."""
    base = load_perf(tier, backend)
    out = {}
    for r in rows:
        b = base.get((r["model"], r["config"]))
        if b is None or b["backend"] != r["backend"]:
            continue
        parts = []
        for mode in TIMED_MODES:
            key, new = f"{mode}_step_ms", r.get(f"{mode}_step_ms")
            if not new or not b[key] or not float(b[key]):
                continue
            change = new / float(b[key]) - 1
            verdict = "noise" if abs(change) < PERF_NOISE else ("slower" if change > 0 else "faster")
            parts.append(f"{'captured' if mode == 'lazy_captured' else mode} {change:+.0%} ({verdict})")
        if parts:
            out[(r["model"], r["config"])] = ", ".join(parts)
    return out
