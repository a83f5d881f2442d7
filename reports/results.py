"""Reading results files back: ``results.jsonl`` (every field), ``meta.json`` (provenance)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

REPORTS = ("mlp-width", "async", "models")


def report_dir(path: Path, name: str) -> Path | None:
    """The directory holding ``name``'s results under ``path`` (``path/name`` or ``path`` itself)."""
    for d in (path / name, path):
        if (d / "results.jsonl").exists():
            rows = read_rows(d)
            if not rows or rows[0].get("report", name) == name:
                return d
    return None


def read_rows(d: Path) -> list[dict[str, Any]]:
    with (d / "results.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def read_meta(d: Path) -> dict[str, Any]:
    p = d / "meta.json"
    return json.loads(p.read_text()) if p.exists() else {}


def load(d: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """(provenance, one DataFrame row per results row) of the report in ``d``."""
    rows = read_rows(d)
    df = pd.DataFrame(rows)
    if "status" not in df:
        df["status"] = pd.Series(dtype=object)
    return read_meta(d), df


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if len(df) else df


def read_timeline(d: Path, rel: str) -> dict | None:
    p = d / rel
    return json.loads(p.read_text()) if p.exists() else None
