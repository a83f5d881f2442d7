"""`harness run --tier unit|models|full`: pick the models, run each isolated, write results, check expectations."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.cells import CellRunner, Job, Outcome
from harness.results import provenance
from reports.schema import ModelRow

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_DIR = ROOT / "ci" / "expected"
HEADLINE = [("mlp_w64", "default"), ("mlp_w128", "default"), ("mlp_w256", "default"),
            ("resnet18", "default"), ("gpt2_small", "default")]
EXPECTED_COLUMNS = ["model", "config", "status", "graphs_per_step", "compiles_after_warmup"]
PERF_NOISE = 0.10  # single models swing by 5-10 % here: smaller changes are reported as noise


def models_tier() -> list[tuple[str, str]]:
    """The headline models plus tiny zoo models chosen greedily until every trait value is covered once."""
    import model_zoo

    chosen = list(HEADLINE)
    covered = {(k, model_zoo.get(m).traits.get(k)) for m, _ in chosen for k in model_zoo.TRAIT_KEYS}
    covered |= {("family", model_zoo.get(m).family) for m, _ in chosen}
    for spec in sorted(model_zoo.all_specs(), key=lambda s: s.name):
        values = {(k, spec.traits.get(k)) for k in model_zoo.TRAIT_KEYS} | {("family", spec.family)}
        if values - covered:
            chosen.append((spec.name, "tiny"))
            covered |= values
    return chosen


def full_tier() -> list[tuple[str, str]]:
    import model_zoo

    return [(s.name, c) for s in model_zoo.all_specs() for c in s.configs]


def available_backends() -> list[str]:
    import torch

    return ["pfvm:cpu"] + (["pfvm:cuda"] if torch.cuda.is_available() else [])


def run_models(todo: list[tuple[str, str]], backends: list[str], steps: int, out: Path, jobs: int = 1,
               timeout: int = 900) -> list[ModelRow]:
    """Run each (model, config, backend) in a child process (``python -m harness.runner``); every one
    gives a row, even on a crash, an OOM or a hang."""
    from harness.runner import repro_command

    cells: dict[Job, tuple[str, str, str]] = {}
    for b in backends:
        for m, c in todo:
            part = out / "rows" / f"{m}-{c}-{b.replace(':', '_')}.json"
            args = ("--model", m, "--config", c, "--backend", b, "--steps", str(steps), "--out", str(part))
            cells[Job(f"{m}:{c} on {b}", "harness.runner", args, part)] = (m, c, b)

    def finish(o: Outcome) -> ModelRow:
        if o.kind == "result":
            row = ModelRow.from_json(json.loads(o.job.result.read_text()), where=str(o.job.result))
        else:
            m, c, b = cells[o.job]
            row = ModelRow(model=m, config=c, backend=b, steps=steps, repro=repro_command(m, c, b, steps),
                           time_kind="measured wall time", status="fail_to_run" if o.kind == "crash" else o.kind,
                           reason=o.reason)
        row.wall_s = round(o.wall_s, 1)
        return row

    with CellRunner(len(cells), "models", jobs=jobs, timeout=timeout) as runner:
        return runner.run(list(cells), finish)


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The terminal table of row records (``ModelRow.to_json()``)."""
    import pandas as pd

    cols = ["model", "config", "backend", "status", "eager_step_ms", "lazy_step_ms", "context_step_ms",
            "lazy_context_ratio", "trace_ms", "graphs_per_step", "compiles_after_warmup", "implicit_syncs_per_step"]
    df = pd.DataFrame(rows)
    df = df[[c for c in cols if c in df.columns]]
    return df.to_string(index=False, float_format=lambda v: f"{v:.2f}")


def expected_path(tier: str, backend: str) -> Path:
    return EXPECTED_DIR / f"{tier}_{backend.replace(':', '_')}.csv"


def check_expected(rows: list[dict[str, Any]], tier: str, backend: str) -> list[str]:
    """Differences from the checked-in expectations: regressions and unexpected improvements alike."""
    import pandas as pd

    path = expected_path(tier, backend)
    if not path.exists():
        return [f"no expected-results file {path.relative_to(ROOT)}"]
    exp = pd.read_csv(path, dtype=str).fillna("")
    want = {(r["model"], r["config"]): r for r in exp.to_dict("records")}
    problems = []
    got_keys = set()
    for r in rows:
        if r["backend"] != backend:
            continue
        key = (r["model"], r["config"])
        got_keys.add(key)
        e = want.get(key)
        if e is None:
            problems.append(f"{key[0]}:{key[1]}: not in {path.name} (new model)")
            continue
        for col in EXPECTED_COLUMNS[2:]:
            g = "" if r.get(col) is None else str(r.get(col))
            if g != e[col]:
                kind = "improvement" if col == "status" and g == "pass" else "regression" if col == "status" else "change"
                problems.append(f"{key[0]}:{key[1]}: {col} {e[col]!r} -> {g!r} ({kind})")
    for key in want:
        if key not in got_keys:
            problems.append(f"{key[0]}:{key[1]}: expected but not run")
    return problems


def perf_path(tier: str, backend: str) -> Path:
    return EXPECTED_DIR / f"perf_{tier}_{backend.replace(':', '_')}.csv"


PERF_COLUMNS = ["model", "config", "backend", "eager_step_ms", "lazy_step_ms", "context_step_ms", "trace_ms"]


def write_expected(rows: list[dict[str, Any]], tier: str, backend: str) -> list[Path]:
    """Rewrite the expectations (status, graphs, compiles) and the performance baseline of one tier/backend."""
    import pandas as pd

    rows = [r for r in rows if r["backend"] == backend]
    path, perf = expected_path(tier, backend), perf_path(tier, backend)
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame([{c: r.get(c, "") for c in EXPECTED_COLUMNS} for r in rows]).sort_values(
        ["model", "config"]).to_csv(path, index=False)
    pd.DataFrame([{c: r.get(c, "") for c in PERF_COLUMNS} for r in rows]).sort_values(
        ["model", "config"]).to_csv(perf, index=False)
    return [path, perf]


def perf_report(rows: list[dict[str, Any]], baseline: Path) -> list[str]:
    """Step-time changes against a stored baseline; never a failure, changes under PERF_NOISE are noise."""
    import pandas as pd

    if not baseline.exists():
        return []
    base = pd.read_csv(baseline)
    lines = []
    for r in rows:
        m = base[(base.model == r["model"]) & (base.config == r["config"]) & (base.backend == r["backend"])]
        if m.empty or not r.get("lazy_step_ms") or "lazy_step_ms" not in m:
            continue
        old = float(m.iloc[0]["lazy_step_ms"])
        change = r["lazy_step_ms"] / old - 1 if old else 0.0
        verdict = "noise" if abs(change) < PERF_NOISE else ("slower" if change > 0 else "faster")
        lines.append(f"{r['model']}:{r['config']} lazy step {old:.1f} -> {r['lazy_step_ms']:.1f} ms ({change:+.0%}, {verdict})")
    return lines


def markdown_summary(rows: list[dict[str, Any]], meta: dict, problems: list[str]) -> str:
    lines = [f"# harness run --tier {meta['tier']}", "",
             f"- commit `{meta['commit']}`, torch {meta['torch']}, {meta['machine']}, {meta['when']}",
             f"- times are measured wall time; {meta['steps']} steps per mode, step time = median after the first",
             "", summary_table(rows).replace("\n", "\n    ").join(["    ", ""]), ""]
    lines += ["## Expectation check", ""] + ([f"- {p}" for p in problems] or ["- all rows match ci/expected"])
    return "\n".join(lines) + "\n"


def run_unit(jobs: int | None) -> int:
    cmd = [sys.executable, "-m", "pytest", "-n", str(jobs or "auto"), "-q", "-m", "unit", str(ROOT / "tests")]
    return subprocess.call(cmd, cwd=ROOT)


def metadata(tier: str, steps: int) -> dict[str, Any]:
    """The tier's provenance (``harness.results.provenance``) with the tier and its step count."""
    return {"tier": tier, "steps": steps, **provenance()}
