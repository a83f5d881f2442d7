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


def write_results(rows: Sequence[Row], out: Path, meta: dict[str, Any], *, stamp: bool = False) -> ResultsFiles:
    """Write the three files; ``stamp`` repeats the provenance in every row (tier results are read
    row by row, without ``meta.json``). The load average at the end is added to the provenance."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    meta = {**meta, "loadavg_end": list(os.getloadavg())}
    head = meta if stamp else {}
    files = ResultsFiles(out / "results.jsonl", out / "results.csv", out / "meta.json")
    with files.jsonl.open("w") as f:
        for r in rows:
            f.write(json.dumps({**head, **r.to_json()}) + "\n")
    csv_head = {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in head.items()}
    pd.DataFrame([{**csv_head, **r.csv_record()} for r in rows]).to_csv(files.csv, index=False)
    files.meta.write_text(json.dumps(meta, indent=1))
    return files
