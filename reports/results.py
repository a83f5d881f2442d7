"""Reading results files back: ``results.jsonl`` (rows checked against ``reports.schema.PerfRow``),
``meta.json`` (provenance)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from reports.schema import PEER_BACKEND, PerfRow

REPORTS = ("mlp-width", "async", "models")


def report_dir(path: Path, name: str) -> Path | None:
    """The directory holding ``name``'s results under ``path`` (``path/name`` or ``path`` itself)."""
    for d in (path / name, path):
        if (d / "results.jsonl").exists():
            rows = read_rows(d)
            if not rows or rows[0].report == name:
                return d
    return None


def read_rows(d: Path) -> list[PerfRow]:
    """The rows of ``d/results.jsonl``; ``SchemaError`` (naming the file and line) for fields the
    schema does not declare or lacks."""
    path = d / "results.jsonl"
    with path.open() as f:
        return [PerfRow.from_json(json.loads(line), where=f"{path}:{n}") for n, line in enumerate(f, 1)
                if line.strip()]


def read_meta(d: Path) -> dict[str, Any]:
    p = d / "meta.json"
    return json.loads(p.read_text()) if p.exists() else {}


def load(d: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """(provenance, one DataFrame row per results row) of the report in ``d``."""
    df = pd.DataFrame([r.to_json() for r in read_rows(d)])
    if "status" not in df:
        df["status"] = pd.Series(dtype=object)
    return read_meta(d), df


def split_peers(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows of mncore's backends, the peers rows): peers (eager PyTorch, torch.compile) have tables
    of their own."""
    if not len(df):
        return df, df
    peer = df["backend"] == PEER_BACKEND
    return df[~peer], df[peer]


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if len(df) else df


def read_timeline(d: Path, rel: str) -> dict | None:
    p = d / rel
    return json.loads(p.read_text()) if p.exists() else None
