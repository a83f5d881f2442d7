"""`harness registry record|stats|show`: fill the shape registry by training zoo models one step.

Each (model, config) is recorded in its own subprocess (a crash or OOM in one model cannot take
the run down), eagerly on CPU through ``EagerRecorder`` and lazily on ``mncore`` (pfvm:cpu)
through ``LazyRecorder``; the per-model files are merged into ``shape_registry/data/registry.jsonl``.
The lazy pass also counts the implicit syncs a steady-state training step causes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent.parent / "shape_registry" / "data" / "registry.jsonl"
STEPS = 2  # the second step is the steady state (optimizer state exists)


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
                after = mncore.metrics.counters()
        mncore.wait_device_ops()
        info["implicit_syncs_per_step"] = after["implicit_syncs"] - before["implicit_syncs"]
        info["fallback_ops_per_step"] = after["fallback_ops"] - before["fallback_ops"]
        info["traced_ops_per_step"] = after["traced_ops"] - before["traced_ops"]
    reg.models[key] = info
    reg.save(out)
    del torch


def record(models: list[str], configs: list[str], out: Path, jobs: int = 1, timeout: int = 1800,
           lazy: bool = True, max_batch: int | None = None) -> int:
    """Record every (model, config) in a child process and merge the results into ``out``."""
    from harness.progress import Progress
    from shape_registry import Registry

    todo = [(m, c) for m in models for c in configs]
    merged = Registry()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        running: list = []
        bar = Progress(len(todo), "recording")
        queue = list(todo)
        while queue or running:
            while queue and len(running) < jobs:
                m, c = queue.pop(0)
                part = Path(tmp) / f"{m}-{c}.jsonl"
                cmd = [sys.executable, "-m", "harness.registry_cmd", m, c, str(part)] + ([] if lazy else ["--no-lazy"])
                if max_batch and c != "tiny":
                    cmd += ["--max-batch", str(max_batch)]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"))
                running.append((m, c, part, proc, time.monotonic()))
            for item in list(running):
                m, c, part, proc, t0 = item
                if proc.poll() is None and time.monotonic() - t0 < timeout:
                    continue
                if proc.poll() is None:
                    proc.kill()
                    failures.append(f"{m}:{c}: timeout after {timeout}s")
                elif proc.returncode != 0 or not part.exists():
                    tail = (proc.stdout.read() if proc.stdout else "")[-600:]
                    failures.append(f"{m}:{c}: exit {proc.returncode}: {tail.strip()}")
                else:
                    merged.merge(Registry.load(part))
                running.remove(item)
                bar.step(f"{m}:{c} ({time.monotonic() - t0:.0f}s)")
            time.sleep(0.05)
        bar.close()
    if out.exists():
        old = Registry.load(out)
        keep = {k for k in old.models if k not in merged.models}
        if keep:  # rows of models not re-recorded stay; re-recorded models replace theirs
            for e in old.sorted():
                e.models &= keep
                if e.models:
                    merged.add(e)
            merged.models.update({k: old.models[k] for k in keep})
    merged.save(out)
    print(f"wrote {out}: {len(merged)} rows, {len(merged.ops())} ops, {len(merged.models)} model configs")
    for f in failures:
        print(f"FAILED {f}", file=sys.stderr)
    return 1 if failures else 0


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
