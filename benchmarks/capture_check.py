"""What periodic re-validation (``check_every``, ``MNCORE_CAPTURE_CHECK``) costs a captured step, side by side.

Two copies of the seed's MLP (``mlp_w<width>``, batch 64, SGD) train in one process under
``mncore.capture``, one with ``check_every=0`` (never re-validate) and one with the checked rate
(default 100, the knob's default): each re-validation traces the step again, as lazy mode does every
step, so its cost spreads over the calls between checks. Blocks of steps alternate between the two so
that the machine's noise falls on both; a block is timed from its first step to the completion of its
last (``wait_device_ops``), and a block holds several checks. Prints the median step time of each over
blocks and their ratio: measured wall time on ``pfvm:cpu``; on ``mncore2:auto`` in performance mode,
measured host time with modelled device time.

    python benchmarks/capture_check.py [--backend pfvm:cpu|mncore2:auto] [--width 64] [--check-every 100]
"""
from __future__ import annotations

import argparse
import functools
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sidebyside import alternate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="pfvm:cpu", help="pfvm:cpu, mncore2:auto (performance mode), ...")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--check-every", type=int, default=100, help="the re-validation rate compared with none")
    ap.add_argument("--blocks", type=int, default=16, help="blocks per setting (the order alternates)")
    a = ap.parse_args(argv)
    if a.check_every < 1:
        ap.error("--check-every must be at least 1 (0 is the baseline it is compared with)")

    import mncore
    import model_zoo
    from harness.perf import Backend, init_backend

    backend = Backend.parse(a.backend)
    simulated = backend.sim_mode is not None
    init_backend(backend)
    spec = model_zoo.get(f"mlp_w{a.width}")
    batches = [spec.make_batch("default", seed=i) for i in range(4)]
    steps = {}
    for every in (0, a.check_every):
        model = spec.build("default", seed=0).to("mncore")
        opt = spec.optimizer(model.parameters())
        steps[every] = mncore.capture(check_every=every)(
            lambda b, model=model, opt=opt: model_zoo.train_step(spec, model, opt, b))

    def run(every: int, i: int) -> None:
        steps[every](model_zoo.batch_to(batches[i % len(batches)], "mncore"))
        mncore.sync()

    for i in range(5):  # warm-up: both record twice, then replay
        for every in steps:
            run(every, i)
    mncore.wait_device_ops()
    per_block = 2 * a.check_every  # two checks per block, at the same calls of each block
    runs = {every: functools.partial(run, every) for every in steps}
    med = {every: v * 1e6 for every, v in alternate(runs, a.blocks, per_block, mncore.wait_device_ops).items()}
    kind = "measured host time, modelled device time" if simulated else "measured wall time"
    print(f"MLP w={a.width}, batch 64, SGD, captured on {backend.label}; {kind} per step, median of {a.blocks} blocks of "
          f"{per_block} steps")
    print(f"  check_every=0 (never):        {med[0]:8.1f} us")
    print(f"  check_every={a.check_every:<17} {med[a.check_every]:8.1f} us")
    print(f"  checked / never:              {med[a.check_every] / med[0]:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
