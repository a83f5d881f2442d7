"""Results files of every runner (``harness run``, ``harness report``): provenance and one writer.

Machine-readable first: ``results.jsonl`` (every field of every row), ``results.csv`` (the same rows
for spreadsheets, as the row schema in ``reports.schema`` says) and ``meta.json`` (provenance).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from reports.schema import Row

ROOT = Path(__file__).resolve().parent.parent


class ResultsFiles(NamedTuple):
    jsonl: Path
    csv: Path
    meta: Path


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def provenance() -> dict[str, Any]:
    """Where and with what the numbers were made (git commit, torch, machine, load at the start)."""
    import torch

    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit + ("+dirty" if dirty else ""), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "when": datetime.now().isoformat(timespec="seconds"), "loadavg_start": list(os.getloadavg())}


def write_owned_json(path: Path, record: dict[str, Any], writer: str) -> None:
    """A benchmark's results file (``record`` stamped ``written_by: writer``); never replaces a file that
    ``writer`` did not write (the user's own file at that path stays, and the message names the option)."""
    if path.exists():
        try:
            mine = json.loads(path.read_text()).get("written_by") == writer
        except (ValueError, AttributeError):
            mine = False
        if not mine:
            raise SystemExit(f"{writer}: {path} exists and was not written by {writer}; pass another --results path")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"written_by": writer, **record}, indent=1) + "\n")
    print(f"results: {path}")


class ResultsWriter:
    """The three files of one run, written as it goes: each row is appended to ``results.jsonl`` (and
    flushed) when its cell finishes, so an interrupted or killed run keeps what finished; ``close``
    writes ``results.csv`` and ``meta.json`` from the rows added. ``stamp`` repeats the provenance in
    every row (tier results are read row by row, without ``meta.json``)."""

    def __init__(self, out: Path, meta: dict[str, Any], *, stamp: bool = False):
        out.mkdir(parents=True, exist_ok=True)
        self.files = ResultsFiles(out / "results.jsonl", out / "results.csv", out / "meta.json")
        self.meta, self.stamp = meta, stamp
        self.rows: list[Row] = []
        self._jsonl = self.files.jsonl.open("w")

    def add(self, row: Row) -> None:
        head = self.meta if self.stamp else {}
        self._jsonl.write(json.dumps({**head, **row.to_json()}) + "\n")
        self._jsonl.flush()
        self.rows.append(row)

    def close(self, **meta_extra: Any) -> ResultsFiles:
        """Finish the files; the load average at the end (and ``meta_extra``) join the provenance."""
        import pandas as pd

        self._jsonl.close()
        meta = {**self.meta, **meta_extra, "loadavg_end": list(os.getloadavg())}
        head = self.meta if self.stamp else {}
        csv_head = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in head.items()}
        pd.DataFrame([{**csv_head, **r.csv_record()} for r in self.rows]).to_csv(self.files.csv, index=False)
        self.files.meta.write_text(json.dumps(meta, indent=1))
        return self.files


def write_results(rows: Sequence[Row], out: Path, meta: dict[str, Any], *, stamp: bool = False) -> ResultsFiles:
    """Write the three files of finished ``rows`` at once (see ``ResultsWriter``)."""
    writer = ResultsWriter(out, meta, stamp=stamp)
    for r in rows:
        writer.add(r)
    return writer.close()
