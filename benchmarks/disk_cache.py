"""Time to the first training step with a cold and with a warm persistent compile cache.

Each model runs twice, each time in a fresh process sharing one new ``MNCORE_CACHE_DIR``: the
first process compiles every graph and stores it, the second should load every graph from disk
(``compiles == 0``). Printed per model: the first step's wall time in each process (MEASURED wall
time: trace + compile or cache load + execution, performance-mode device time included), the
compile time the first process spent, and the cold/warm ratio.

    python benchmarks/disk_cache.py [--device mncore2:auto] [--models mlp_w1024,resnet18,gpt2_small]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import mncore, model_zoo
from model_zoo.spec import batch_to, train_step
name, device = sys.argv[1], sys.argv[2]
mncore.init(device, sim_mode="performance")
spec = model_zoo.get(name)
model = spec.build("default", seed=0).to("mncore")
opt = spec.optimizer(model.parameters())
batch = batch_to(spec.make_batch("default", seed=0), "mncore")
t0 = time.perf_counter()
for _ in range(2):  # the first two steps differ (optimizer state is created in the first)
    train_step(spec, model, opt, batch)
    mncore.sync()
mncore.wait_device_ops()
c = mncore.metrics.counters()
print(json.dumps({"first_steps_s": time.perf_counter() - t0, "compiles": c["compiles"], "compile_s": c["compile_s"],
                  "disk_hits": c["disk_cache_hits"], "trace_s": c["trace_s"]}))
"""


def run_child(name: str, device: str, cache: str) -> dict:
    env = dict(os.environ, MNCORE_CACHE_DIR=cache, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    out = subprocess.run([sys.executable, "-c", CHILD, name, device], env=env, capture_output=True, text=True,
                         check=False, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{name} on {device} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="mncore2:auto")
    ap.add_argument("--models", default="mlp_w1024,resnet18,gpt2_small")
    args = ap.parse_args()
    print(f"first two training steps, backend {args.device} (performance mode), MEASURED wall time per process")
    print(f"{'model':<12} {'cold s':>8} {'compile s':>9} {'warm s':>8} {'warm compiles':>13} {'disk hits':>9} {'cold/warm':>9}")
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="mncore-cache-") as cache:
            t = time.perf_counter()
            cold = run_child(name, args.device, cache)
            warm = run_child(name, args.device, cache)
        print(f"{name:<12} {cold['first_steps_s']:8.2f} {cold['compile_s']:9.2f} {warm['first_steps_s']:8.2f} "
              f"{warm['compiles']:13d} {warm['disk_hits']:9d} {cold['first_steps_s'] / warm['first_steps_s']:9.2f}"
              f"   ({time.perf_counter() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
