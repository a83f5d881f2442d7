"""Lazy mode's step with backward on the calling thread against PyTorch's per-device autograd thread.

A zoo model (default: the seed's MLP at w=64, ``mlp_w64``, batch 64, SGD) trains in lazy mode, retracing every step; blocks of
steps alternate between ``MNCORE_BACKWARD_THREAD=caller`` (mncore's default) and ``device`` (PyTorch's
default for accelerators) in one process, on each backend, so that the machine's noise falls on both.
A block is timed from its first step to the completion of its last (``wait_device_ops``): measured wall
time (on ``mncore2:auto`` performance mode, modelled device time behind measured host time). Prints
the medians over blocks and their ratio.

    python benchmarks/backward_thread.py [--model mlp_w64] [--steps 400] [--blocks 10] [--backend pfvm:cpu,mncore2:auto]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(backend: str, model_name: str, steps: int, blocks: int) -> dict[str, float]:
    """Median seconds per step over ``blocks`` alternating blocks, per backward thread."""
    import torch

    import mncore
    import model_zoo
    from harness.perf import Backend, init_backend

    init_backend(Backend.parse(backend), "async")
    spec = model_zoo.get(model_name)
    model = spec.build("default", seed=0).to("mncore")
    opt = spec.optimizer(model.parameters())
    batches = [model_zoo.batch_to(spec.make_batch("default", seed=i), "mncore") for i in range(4)]

    def block(n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            model_zoo.train_step(spec, model, opt, batches[i % len(batches)])
            mncore.sync()
        mncore.wait_device_ops()
        return (time.perf_counter() - t0) / n

    block(min(20, steps))  # warm-up: compile, cache hits from here on
    times: dict[str, list[float]] = {"caller": [], "device": []}
    per_block = max(1, steps // blocks)
    for b in range(blocks):
        for mode in ("caller", "device") if b % 2 == 0 else ("device", "caller"):
            torch.autograd.set_multithreading_enabled(mode == "device")  # what init(backward_thread=) sets
            times[mode].append(block(per_block))
    torch.autograd.set_multithreading_enabled(mncore.settings.backward_thread == "device")
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp_w64", help="a zoo model (default config), e.g. gpt2_small")
    ap.add_argument("--steps", type=int, default=400, help="timed steps per mode and backend")
    ap.add_argument("--blocks", type=int, default=10, help="alternating blocks the steps are split into")
    ap.add_argument("--backend", default="pfvm:cpu,mncore2:auto", help="comma-separated backends")
    a = ap.parse_args(argv)
    print(f"{a.model} (default config), lazy mode (async), retraced every step; median per step over "
          f"{a.blocks} alternating blocks of {max(1, a.steps // a.blocks)} steps")
    for backend in a.backend.split(","):
        med = measure(backend, a.model, a.steps, a.blocks)
        kind = "modelled device time, measured host time" if backend.startswith("mncore2") else "measured wall time"
        print(f"  {backend:<14} caller {med['caller'] * 1e3:.3f} ms   device thread {med['device'] * 1e3:.3f} ms   "
              f"device/caller {med['device'] / med['caller']:.2f}   ({kind})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
