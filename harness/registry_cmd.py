"""`harness registry record|stats|show`: fill the shape registry by training zoo models one step.

Each (model, config) is recorded in its own subprocess (a crash or OOM in one model cannot take
the run down), eagerly on CPU through ``EagerRecorder`` and lazily on ``mncore`` (pfvm:cpu)
through ``LazyRecorder``; the per-model files are merged into ``shape_registry/data/registry.jsonl``.
The lazy pass also counts the implicit syncs a steady-state training step causes.
"""
from __future__ import annotations

import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.cells import CellRunner, Job, Outcome

if TYPE_CHECKING:
    from harness.cluster import Cluster
    from shape_registry import Registry

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "shape_registry" / "data" / "registry.jsonl"
STEPS = 2  # the second step is the steady state (optimizer state exists)
# imported once by the fork server the recording cells are forked from (hundreds of catalog models)
PRELOAD = ("torch", "mncore", "transformers", "torchvision", "model_zoo", "shape_registry", "harness.registry_cmd")


def record_one(name: str, config: str, out: Path, lazy: bool = True, max_batch: int | None = None) -> None:
    """Record one model/config into ``out`` (runs in a child process)."""
    import torch

    import mncore  # noqa: F401  (registers the device before autograd's engine first starts)
    import model_zoo
    from shape_registry import EagerRecorder, LazyRecorder, Registry

    spec = model_zoo.get(name)
    key = f"{name}:{config}"
    reg = Registry()
    n = spec.batch_sizes[config] if max_batch is None else min(max_batch, spec.batch_sizes[config])
    model = spec.build(config, seed=0)
    opt = spec.optimizer(model.parameters())
    info: dict = {"family": spec.family, "params": sum(p.numel() for p in model.parameters()), "batch_size": n}
    with EagerRecorder(reg, key):
        for step in range(STEPS):
            model_zoo.train_step(spec, model, opt, spec.make_batch(config, batch_size=n, seed=step))
    if lazy:
        mncore.init_cpu(implicit_sync="silent")
        model = spec.build(config, seed=0).to("mncore")
        opt = spec.optimizer(model.parameters())
        with LazyRecorder(reg, key):
            for step in range(STEPS):
                before = mncore.metrics.counters()
                batch = model_zoo.batch_to(spec.make_batch(config, batch_size=n, seed=step), "mncore")
                model_zoo.train_step(spec, model, opt, batch)
                mncore.sync()
                mncore.wait_device_ops()  # the worker's counters are final only once the graphs finished
                after = mncore.metrics.counters()
        info["implicit_syncs_per_step"] = after["implicit_syncs"] - before["implicit_syncs"]
        info["fallback_ops_per_step"] = after["fallback_ops"] - before["fallback_ops"]
        info["traced_ops_per_step"] = after["traced_ops"] - before["traced_ops"]
    info["excluded"] = dict(sorted(reg.excluded.items()))  # per model, so a re-recording can replace them
    reg.models[key] = info
    reg.save(out)
    del torch


@dataclass(frozen=True)
class _Recorded:
    """One child's answer: its registry part, or why there is none."""

    status: str  # 'ok', or the cell outcome: timeout, oom, crash
    part: Registry | None
    failure: str = ""


def record(cells: list[tuple[str, str]], out: Path, jobs: int = 1, timeout: int = 1800,
           lazy: bool = True, max_batch: int | None = None, cluster: Cluster | None = None) -> int:
    """Record every (model, config) in a child process (on ``cluster``; default here, forked from a fork
    server that imported ``PRELOAD``) and merge the results into ``out``."""
    from shape_registry import Registry

    with tempfile.TemporaryDirectory() as tmp:
        todo = []
        for m, c in cells:
            part = Path(tmp) / f"{m}-{c}.jsonl"
            args = [m, c, str(part)] + ([] if lazy else ["--no-lazy"])
            if max_batch and c != "tiny":
                args += ["--max-batch", str(max_batch)]
            todo.append(Job(f"{m}:{c}", "harness.registry_cmd", tuple(args), part, device="pfvm:cpu"))

        def finish(o: Outcome) -> _Recorded:
            if o.kind == "result":
                return _Recorded("ok", Registry.load(o.job.result))
            return _Recorded(o.kind, None, f"{o.job.label}: {o.reason}")

        with CellRunner(len(todo), "recording", jobs=jobs, timeout=timeout, cluster=cluster,
                        preload=PRELOAD) as runner:
            recorded = runner.run(todo, finish)
    merged = Registry()
    for (m, c), r in zip(cells, recorded):
        if r.part is not None:
            merged.merge(r.part)
        else:  # kept in the file: a model that cannot be recorded is a row of its own, with why
            merged.failed[f"{m}:{c}"] = f"{r.status}: {r.failure}"
    if out.exists():
        _keep_unrecorded(Registry.load(out), merged)
    merged.save(out)
    print(f"wrote {out}: {len(merged)} rows, {len(merged.ops())} ops, {len(merged.models)} model configs"
          + (f", {len(merged.failed)} failed to record" if merged.failed else ""))
    failures = [r.failure for r in recorded if r.failure]
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


def _keep_unrecorded(old: Registry, merged: Registry) -> None:
    """Add to ``merged`` what ``old`` knows of the model configs not recorded again: their rows, their
    header entries, their exclusion counts and failures (re-recorded models replace theirs; one that fails
    to record again keeps its old rows, and its failure is noted)."""
    keep = {k for k in old.models if k not in merged.models}
    for e in old.sorted():
        e.models &= keep
        if e.models:
            merged.add(e)
    merged.models.update({k: old.models[k] for k in keep})
    merged.failed.update({k: v for k, v in old.failed.items() if k not in merged.models and k not in merged.failed})
    # exclusion counts: the old totals less those of the replaced models (stored per model since the catalog)
    replaced = [old.models[k].get("excluded", {}) for k in old.models if k not in keep]
    for k, n in old.excluded.items():
        left = n - sum(x.get(k, 0) for x in replaced)
        if left > 0:
            merged.excluded[k] = merged.excluded.get(k, 0) + left


def stats(path: Path) -> str:
    from shape_registry import Registry

    reg = Registry.load(path)
    ops = Counter(e.op for e in reg)
    src = Counter(s for e in reg for s in e.sources)
    excluded = Counter()
    for k, n in reg.excluded.items():
        excluded[k.split(":", 1)[0]] += n
    lines = [f"registry {path}", f"  rows: {len(reg)}   distinct ops: {len(ops)}   model configs: {len(reg.models)}",
             f"  rows by source: {dict(src)}",
             "  excluded calls by rule: " + ", ".join(f"{k}={v}" for k, v in sorted(excluded.items())),
             "  ops with most rows:"]
    lines += [f"    {op:50s} {n}" for op, n in ops.most_common(15)]
    syncs = {k: v.get("implicit_syncs_per_step") for k, v in reg.models.items() if v.get("implicit_syncs_per_step")}
    lines.append(f"  model configs with implicit syncs per lazy step: {syncs or 'none'}")
    return "\n".join(lines)


def show(path: Path, op: str | None, model: str | None, limit: int) -> str:
    from harness.opgen import describe
    from shape_registry import Registry

    rows = Registry.load(path).query(op=op, model=model)
    out = [f"{len(rows)} rows"]
    for e in rows[:limit]:
        out.append(f"{describe(e)}  count={e.count} sources={','.join(sorted(e.sources))} "
                   f"models={','.join(sorted(e.models)[:4])}{'...' if len(e.models) > 4 else ''}")
    return "\n".join(out)


if __name__ == "__main__":  # child: python -m harness.registry_cmd MODEL CONFIG OUT [--no-lazy] [--max-batch N]
    mb = sys.argv[sys.argv.index("--max-batch") + 1] if "--max-batch" in sys.argv else None
    record_one(sys.argv[1], sys.argv[2], Path(sys.argv[3]), lazy="--no-lazy" not in sys.argv,
               max_batch=int(mb) if mb else None)
