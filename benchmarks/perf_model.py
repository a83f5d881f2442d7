"""Modelled MN-Core 2 device time of training steps: the MLP sweep and ResNet-18.

For each model one steady-state training step (the second; the first also creates optimizer
state) is traced and compiled for ``mncore2:auto`` in performance mode, which skips numerics.
Printed per model: modelled device time per step (MODELLED from mncore/sim/costs.json and the
public figures in hardware.json, not measured), FLOPs, bytes moved, the share of kernel time
that is compute-bound, whether the step is compute- or memory-bound, kernels and peak DRAM.

    python benchmarks/perf_model.py [--widths 64,128,...,4096] [--skip-resnet] [--float-dtype float] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mncore  # noqa: E402
import model_zoo  # noqa: E402
from model_zoo.spec import batch_to, train_step  # noqa: E402

WIDTHS = (64, 128, 256, 512, 1024, 2048, 4096)


def modelled_step(name: str, config: str) -> dict:
    """Run two steps; report the executables of the second one."""
    spec = model_zoo.get(name)
    model = spec.build(config, seed=0).to("mncore")
    opt = spec.optimizer(model.parameters())
    batch = batch_to(spec.make_batch(config, seed=0), "mncore")
    train_step(spec, model, opt, batch)
    mncore.sync()
    mncore.wait_device_ops()
    before = mncore.metrics.counters()["modelled_device_s"]
    seen: dict[str, dict] = {}
    with mncore.observe.graph_observer(lambda g: seen.setdefault(g["name"], g["stats"])):
        train_step(spec, model, opt, batch)
        mncore.sync()
        mncore.wait_device_ops()
    st = list(seen.values())
    kernel_s = sum(s["modelled_s"] for s in st)
    compute_s = sum(s["compute_bound_s"] for s in st)
    return {
        "model": name, "config": config, "backend": "mncore2 (performance mode)", "time": "modelled",
        "step_ms": (mncore.metrics.counters()["modelled_device_s"] - before) * 1e3,
        "gflop": sum(s["flops"] for s in st) / 1e9, "gbytes": sum(s["bytes"] for s in st) / 1e9,
        "compute_share": compute_s / kernel_s if kernel_s else 0.0,
        "bound": "compute" if compute_s >= kernel_s / 2 else "memory",
        "kernels": sum(s["kernels"] for s in st), "peak_dram_mb": max(s["peak_bytes"] for s in st) / 2**20,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--skip-resnet", action="store_true")
    ap.add_argument("--float-dtype", default="float", choices=("double", "float", "mixed", "half"))
    ap.add_argument("--json", help="also write the rows as JSON")
    args = ap.parse_args()
    mncore.init("mncore2:auto", sim_mode="performance", float_dtype=args.float_dtype, execution="sync")
    todo = [(f"mlp_w{w}", "default") for w in map(int, args.widths.split(","))]
    if not args.skip_resnet:
        todo.append(("resnet18", "default"))
    rows = []
    print(f"MN-Core 2 performance model, precision policy {args.float_dtype}; times are MODELLED device time")
    print(f"{'model':<12} {'step ms':>9} {'GFLOP':>9} {'GB moved':>9} {'compute %':>9} {'bound':>8} "
          f"{'kernels':>7} {'peak MB':>9}")
    for name, config in todo:
        r = modelled_step(name, config)
        rows.append(r)
        print(f"{name:<12} {r['step_ms']:9.3f} {r['gflop']:9.2f} {r['gbytes']:9.3f} {r['compute_share'] * 100:9.1f} "
              f"{r['bound']:>8} {r['kernels']:7d} {r['peak_dram_mb']:9.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
