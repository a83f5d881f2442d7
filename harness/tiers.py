"""`harness run --tier unit|models|full`: pick the models and run each isolated (the expectations
are ``harness.expectations``, the command ``harness.run_cmd``, its closing summary ``reports.run_summary``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from harness.cells import CellRunner, Job, Outcome
from harness.results import provenance
from reports.schema import ModelRow

if TYPE_CHECKING:
    from harness.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = [("mlp_w64", "default"), ("mlp_w128", "default"), ("mlp_w256", "default"),
            ("resnet18", "default"), ("gpt2_small", "default")]


def representatives(entries: list) -> list[str]:
    """The fewest catalog models, greedily, that cover every (trait, value) of ``entries``: the headline
    models first, then each round the model covering the most values not yet covered (ties: fewer
    parameters, then name)."""
    def values(e) -> set[tuple[str, str]]:  # noqa: ANN001 - a catalog Entry
        return {(k, v) for k, vs in e.traits.items() for v in vs}

    headline = {m for m, _ in HEADLINE}
    chosen = [e for e in entries if e.name in headline]
    covered = set().union(*(values(e) for e in chosen))
    rest = sorted((e for e in entries if e.name not in headline), key=lambda e: (e.params or 0, e.name))
    while True:
        best = max(rest, key=lambda e: len(values(e) - covered), default=None)
        if best is None or not values(best) - covered:
            return [e.name for e in chosen]
        chosen.append(best)
        covered |= values(best)
        rest.remove(best)


def models_tier() -> list[tuple[str, str]]:
    """The headline models (default configs) plus the catalog's representative set (tiny configs): the
    fewest models that cover every trait value of the catalog (what ``ci/expected/models_*.csv`` record)."""
    from model_zoo import catalog

    picked = representatives(catalog.built())
    headline = {m for m, _ in HEADLINE}
    return list(HEADLINE) + [(m, "tiny") for m in picked if m not in headline]


def full_tier() -> list[tuple[str, str]]:
    """Every hand-written zoo model in every config, then every other catalog model that built (tiny)."""
    import model_zoo
    from model_zoo import catalog

    zoo = [(s.name, c) for s in model_zoo.all_specs() for c in s.configs]
    hand_written = {m for m, _ in zoo}
    return zoo + [(e.name, "tiny") for e in catalog.built() if e.name not in hand_written]


def available_backends() -> list[str]:
    """The full tier's backends: pfvm on CPU (and CUDA when present), the emulator and a simulated board."""
    import torch

    return ["pfvm:cpu"] + (["pfvm:cuda"] if torch.cuda.is_available() else []) + ["emu2", "mncore2:auto"]


# imported once by the fork server every tier cell is forked from (a cell then starts in milliseconds)
CELL_PRELOAD = ("torch", "mncore", "mncore.context", "transformers", "torchvision", "model_zoo", "harness.runner")


def run_id() -> str:
    """A name no earlier run of the same ``--out`` used: rows are read only from this run's directory,
    so a stale row (an earlier run's, or a leftover child's that finished late) is never taken."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def run_models(todo: list[tuple[str, str]], backends: list[str], steps: int, out: Path, jobs: int = 1,
               timeout: int = 900, on_row: Callable[[ModelRow], None] | None = None,
               cluster: Cluster | None = None, fork: bool = False) -> list[ModelRow]:
    """Run each (model, config, backend) in a child process (``python -m harness.runner``, on ``cluster``:
    default here); every one gives a row, even on a crash, an OOM, a hang or a lost node. ``on_row`` sees
    each row as its cell finishes. ``fork``: local cells are forked from a fork server that imported
    ``CELL_PRELOAD`` (the full tier's hundreds of tiny models would otherwise spend most of their time
    importing)."""
    from harness.runner import repro_command

    rows_dir = out / "rows" / run_id()
    cells: dict[Job, tuple[str, str, str]] = {}
    for b in backends:
        for m, c in todo:
            part = rows_dir / f"{m}-{c}-{b.replace(':', '_')}.json"
            args = ("--model", m, "--config", c, "--backend", b, "--steps", str(steps), "--out", str(part))
            cells[Job(f"{m}:{c} on {b}", "harness.runner", args, part, device=b)] = (m, c, b)

    def finish(o: Outcome) -> ModelRow:
        if o.kind == "result":
            row = ModelRow.from_json(json.loads(o.job.result.read_text()), where=str(o.job.result))
        else:
            m, c, b = cells[o.job]
            row = ModelRow(model=m, config=c, backend=b, steps=steps, repro=repro_command(m, c, b, steps),
                           time_kind="measured wall time", status="fail_to_run" if o.kind == "crash" else o.kind,
                           reason=o.reason)
        row.wall_s, row.node = round(o.wall_s, 1), o.node or None
        if on_row is not None:
            on_row(row)
        return row

    with CellRunner(len(cells), "models", jobs=jobs, timeout=timeout, cluster=cluster,
                    preload=CELL_PRELOAD if fork else ()) as runner:
        return runner.run(list(cells), finish)


def run_unit(jobs: int | None) -> int:
    cmd = [sys.executable, "-m", "pytest", "-n", str(jobs or "auto"), "-q", "-m", "unit", str(ROOT / "tests")]
    return subprocess.call(cmd, cwd=ROOT)


def metadata(tier: str, steps: int) -> dict[str, Any]:
    """The tier's provenance (``harness.results.provenance``) with the tier and its step count."""
    return {"tier": tier, "steps": steps, **provenance()}
