"""pfvm:cpu graphs where ``MNCORE_CPU_THREAD=auto`` (the default) runs them against all on the worker thread.

``auto`` runs a graph on the submitting thread unless its memory plan peaks above 256 MiB (here: the
MLP at w=4096), which goes to the worker; ``worker`` runs every graph there.

The seed's MLP (``mlp_w<W>``, batch 64, SGD) trains in lazy mode (retraced every step), captured
(``mncore.capture``) and with the Context API, in ``execution="async"``. Each measurement runs in a
fresh process: once a second thread has run intra-op parallel kernels, its idle OpenMP team slows the
other thread's kernels for the rest of the process, so the two settings cannot share one. Rounds
alternate the order of the settings, so that the machine's noise falls on both. A measurement is the
median over blocks of steps, each timed from its first step to the completion of its last
(``wait_device_ops``): measured wall time. Prints the medians over rounds and worker/auto.

    python benchmarks/cpu_thread.py [--widths 64,256,1024,4096] [--modes lazy,captured,context] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
SETTINGS = ("auto", "worker")


def measure(width: int, mode: str, steps: int, blocks: int) -> float:
    """Median seconds per step over ``blocks`` blocks, in this process (its MNCORE_CPU_THREAD)."""
    import tempfile
    import warnings
    from pathlib import Path

    import mncore
    import model_zoo
    from harness.perf import Backend, _mndevice, init_backend
    from harness.runner import capturable, context_step

    backend = Backend.parse("pfvm:cpu")
    init_backend(backend, "async")
    spec = model_zoo.get(f"mlp_w{width}")
    batches = [spec.make_batch("default", seed=i) for i in range(4)]
    model = spec.build("default", seed=0)
    if mode == "context":
        ctx, step_fn = context_step(spec, model, _mndevice(backend))
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = ctx.compile(step_fn, batches[0], Path(tmp) / "step")

        def step(i: int) -> None:
            compiled(batches[i % len(batches)])
    else:
        model = model.to("mncore")
        opt = spec.optimizer(model.parameters())
        capturable(opt)
        train = lambda batch: model_zoo.train_step(spec, model, opt, batch)  # noqa: E731
        if mode == "captured":
            train = mncore.capture(train)

        def step(i: int) -> None:
            train(model_zoo.batch_to(batches[i % len(batches)], "mncore"))
            mncore.sync()

    def block(n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        mncore.wait_device_ops()
        return (time.perf_counter() - t0) / n

    block(10)  # warm-up: compile, optimizer state, capture's recordings
    per_block = max(1, steps // blocks)
    return statistics.median(block(per_block) for _ in range(blocks))


def _child(width: int, mode: str, setting: str, steps: int, blocks: int) -> float:
    env = dict(os.environ, MNCORE_CPU_THREAD=setting)
    cmd = [sys.executable, __file__, "--one", f"{width},{mode}", "--steps", str(steps), "--blocks", str(blocks)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["s_per_step"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="64,256,1024,4096", help="MLP widths (comma-separated)")
    ap.add_argument("--modes", default="lazy,captured,context", help="lazy, captured, context (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per setting and cell")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per process (fewer above w=512)")
    ap.add_argument("--blocks", type=int, default=5, help="blocks the timed steps are split into")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # WIDTH,MODE: one measurement in this process, as JSON
    a = ap.parse_args(argv)
    if a.one:
        width, mode = a.one.split(",")
        print(json.dumps({"s_per_step": measure(int(width), mode, a.steps, a.blocks)}))
        return 0
    print(f"pfvm:cpu, async, seed MLP batch 64: median per step (measured wall time) over {a.rounds} fresh "
          f"processes per setting; MNCORE_CPU_THREAD=auto (default) against worker")
    print(f"{'width':>6} {'mode':<9} {'auto ms':>10} {'worker ms':>10} {'worker/auto':>12}")
    for width in (int(w) for w in a.widths.split(",")):
        steps = a.steps if width <= 512 else max(a.blocks * 4, a.steps * 64 // width)
        for mode in a.modes.split(","):
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for r in range(a.rounds):
                for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                    times[setting].append(_child(width, mode, setting, steps, a.blocks))
            med = {s: statistics.median(v) for s, v in times.items()}
            print(f"{width:>6} {mode:<9} {med['auto'] * 1e3:>10.3f} {med['worker'] * 1e3:>10.3f} "
                  f"{med['worker'] / med['auto']:>12.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
