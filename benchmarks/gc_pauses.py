"""Python garbage-collection pauses inside lazy-mode training steps, under each collector policy.

The policies: the default (``MNCORE_GC_FREEZE=1`` and ``MNCORE_GC_AT_SYNC=1``: long-lived objects frozen,
young generations collected at graph cuts), freezing only, and neither (CPython's own collector).

Each setting runs in its own process (the collector's state is per process): a zoo model trains on
pfvm:cpu in ``execution="sync"``; collections are timed with ``gc.callbacks`` from step ``--warmup`` on
(after the model, the optimizer state and the executables exist). Printed per generation: count, total
and longest pause, all measured wall time.

    python benchmarks/gc_pauses.py [--model gpt2_small] [--config default] [--steps 6] [--warmup 3]
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def child(model: str, config: str, steps: int, warmup: int) -> dict:
    import mncore
    import model_zoo
    from model_zoo.spec import batch_to, train_step

    mncore.init_cpu(execution="sync")
    spec = model_zoo.get(model)
    net = spec.build(config, seed=0).to("mncore")
    opt = spec.optimizer(net.parameters())
    batch = batch_to(spec.make_batch(config, seed=0), "mncore")
    pauses: dict[int, list[float]] = collections.defaultdict(list)
    start: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            start[:] = [time.perf_counter()]
        elif start:
            pauses[info["generation"]].append(time.perf_counter() - start[0])

    for i in range(warmup + steps):
        if i == warmup:
            gc.callbacks.append(timed)
        train_step(spec, net, opt, batch)
        mncore.sync()
        mncore.wait_device_ops()
    return {str(g): {"count": len(p), "total_ms": sum(p) * 1e3, "max_ms": max(p) * 1e3}
            for g, p in sorted(pauses.items())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2_small")
    ap.add_argument("--config", default="default")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.config, args.steps, args.warmup)))
        return 0
    print(f"{args.model} ({args.config}) on pfvm:cpu, {args.steps} steps after {args.warmup} warm-up steps; "
          "garbage-collection pauses, measured wall time")
    for freeze, at_sync in (("1", "1"), ("1", "0"), ("0", "0")):
        env = dict(os.environ, MNCORE_GC_FREEZE=freeze, MNCORE_GC_AT_SYNC=at_sync)
        out = subprocess.run([sys.executable, __file__, "--child", "--model", args.model, "--config", args.config,
                              "--steps", str(args.steps), "--warmup", str(args.warmup)],
                             capture_output=True, text=True, env=env, check=True).stdout
        res = json.loads(out.strip().splitlines()[-1])
        cells = ", ".join(f"gen{g}: {r['count']} x, {r['total_ms']:.1f} ms total, longest {r['max_ms']:.1f} ms"
                          for g, r in res.items()) or "no collection"
        print(f"MNCORE_GC_FREEZE={freeze} MNCORE_GC_AT_SYNC={at_sync}: {cells}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
