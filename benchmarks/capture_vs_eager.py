"""A captured lazy-mode step against eager PyTorch's own step, side by side in one process.

The seed's MLP (``mlp_w<width>``, batch 64, SGD) trains on the CPU in eager mode and on ``pfvm:cpu``
under ``mncore.capture``; blocks of steps alternate between the two so that the machine's noise falls
on both. A block is timed from its first step to the completion of its last (the captured one until
``wait_device_ops`` returns: replays run ahead of the device as in a training loop), measured wall
time; a step's time is its block's over its steps. Prints the medians over blocks and their ratio.

    python benchmarks/capture_vs_eager.py [--width 64] [--steps 200] [--blocks 10]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sidebyside import alternate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per mode")
    ap.add_argument("--blocks", type=int, default=10, help="alternating blocks the steps are split into")
    a = ap.parse_args(argv)

    import mncore
    import model_zoo

    mncore.init_cpu()
    spec = model_zoo.get(f"mlp_w{a.width}")
    batches = [spec.make_batch("default", seed=i) for i in range(8)]
    eager_model = spec.build("default", seed=0)
    eager_opt = spec.optimizer(eager_model.parameters())
    lazy_model = spec.build("default", seed=0).to("mncore")
    lazy_opt = spec.optimizer(lazy_model.parameters())
    device_batches = [model_zoo.batch_to(b, "mncore") for b in batches]
    step = mncore.capture(lambda b: model_zoo.train_step(spec, lazy_model, lazy_opt, b))

    def eager(i: int) -> None:
        model_zoo.train_step(spec, eager_model, eager_opt, batches[i % len(batches)])

    def captured(i: int) -> None:
        step(device_batches[i % len(device_batches)])
        mncore.sync()

    for i in range(5):  # warm-up: capture records, then replays
        eager(i)
        captured(i)
    mncore.wait_device_ops()
    per_block = max(1, a.steps // a.blocks)
    med = {k: v * 1e3 for k, v in alternate({"eager": eager, "captured": captured}, a.blocks, per_block,
                                            mncore.wait_device_ops).items()}
    replays = mncore.metrics.counters()["replays"]
    print(f"MLP w={a.width}, batch 64, SGD; measured wall time per step, median of {a.blocks} blocks "
          f"of {per_block} steps")
    print(f"  eager PyTorch (CPU):         {med['eager']:.3f} ms")
    print(f"  mncore.capture (pfvm:cpu):   {med['captured']:.3f} ms   ({replays} replays)")
    print(f"  captured / eager:            {med['captured'] / med['eager']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
