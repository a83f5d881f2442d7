"""A captured lazy-mode step against the Context API's and eager PyTorch's, side by side in one process.

The seed's MLP (``mlp_w<width>``, batch 64, SGD) trains on the CPU in eager mode, and on ``--backend``
with the Context API (compiled once, called with the host batch) and under ``mncore.capture`` (the
batch uploaded with ``.mncore()``, then ``sync()``, as the harness's lazy rows do); blocks of steps
alternate between the three so that the machine's noise falls on all of them. A block is timed from
its first step until ``wait_device_ops`` returns after its last (replays and Context calls run ahead
of the device as in a training loop): measured wall time, in which a simulator in performance mode
holds readers until its modelled device time. A step's time is its block's over its steps. Prints the
medians over blocks and the ratios the capture targets name: captured / Context (≤ 1.10) and, on
pfvm:cpu at w=64, captured / eager (≤ 1.00).

    python benchmarks/capture_vs_eager.py [--backend pfvm:cpu] [--width 64] [--steps 200] [--blocks 10]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sidebyside import alternate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="pfvm:cpu", help="pfvm:cpu, mncore2:auto (performance mode), ...")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per mode")
    ap.add_argument("--blocks", type=int, default=10, help="alternating blocks the steps are split into")
    a = ap.parse_args(argv)

    import mncore
    import model_zoo
    from harness.perf import Backend, _mndevice, init_backend
    from harness.runner import context_step

    backend = Backend.parse(a.backend)
    init_backend(backend)
    spec = model_zoo.get(f"mlp_w{a.width}")
    batches = [spec.make_batch("default", seed=i) for i in range(8)]
    eager_model = spec.build("default", seed=0)
    eager_opt = spec.optimizer(eager_model.parameters())
    lazy_model = spec.build("default", seed=0).to("mncore")
    lazy_opt = spec.optimizer(lazy_model.parameters())
    step = mncore.capture(lambda b: model_zoo.train_step(spec, lazy_model, lazy_opt, b))
    ctx, step_fn = context_step(spec, spec.build("default", seed=0), _mndevice(backend))
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frozen-constant notices
        compiled = ctx.compile(step_fn, batches[0], Path(tmp) / "step")

    def eager(i: int) -> None:
        model_zoo.train_step(spec, eager_model, eager_opt, batches[i % len(batches)])

    def context(i: int) -> None:
        compiled(batches[i % len(batches)])

    def captured(i: int) -> None:
        step(model_zoo.batch_to(batches[i % len(batches)], "mncore"))
        mncore.sync()

    steps = {"eager": eager, "context": context, "captured": captured}
    for i in range(5):  # warm-up: capture records, then replays
        for run in steps.values():
            run(i)
    mncore.wait_device_ops()
    per_block = max(1, a.steps // a.blocks)
    med = {k: v * 1e3 for k, v in alternate(steps, a.blocks, per_block, mncore.wait_device_ops).items()}
    replays = mncore.metrics.counters()["replays"]
    kind = "measured wall time" if backend.sim_mode is None else "measured wall time over modelled device time"
    print(f"MLP w={a.width}, batch 64, SGD on {backend.label}; {kind} per step, median of {a.blocks} blocks "
          f"of {per_block} steps")
    print(f"  eager PyTorch (CPU):        {med['eager']:.3f} ms")
    print(f"  Context API:                {med['context']:.3f} ms")
    print(f"  mncore.capture:             {med['captured']:.3f} ms   ({replays} replays)")
    print(f"  captured / Context:         {med['captured'] / med['context']:.2f}")
    print(f"  captured / eager:           {med['captured'] / med['eager']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
