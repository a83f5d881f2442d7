"""A lazy training step on pfvm:cpu with and without re-inplacing, side by side in one run.

Two copies of a zoo model (default config, dropout off) train on the same batches in one process,
step by step in alternation: one runs its graphs as the generated code with fresh intermediates
written in place (``compile/reinplace.py``, the default), the other as the functional graph, every op
making a new tensor (``MNCORE_REINPLACE=0``, what pfvm ran before), and eager PyTorch's step on the
CPU runs beside them. ``execution="sync"``: a step's time includes running its graph. Prints the
median step time of each (measured wall time, pfvm:cpu), the ratio, and whether the two mncore
copies' parameters are bit-identical after the last step.

    python benchmarks/reinplace.py [--models gpt2_small,resnet18,mlp_w4096] [--steps 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def measure(model_name: str, steps: int, warmup: int = 2) -> dict:
    """Median step seconds in place, functional and eager, and whether the two lazy copies agree bit for bit."""
    import torch

    import mncore
    import model_zoo
    from harness.runner import disable_dropout

    spec = model_zoo.get(model_name)
    mncore.init("pfvm:cpu", implicit_sync="silent", execution="sync")
    batches = [spec.make_batch("default", seed=i) for i in range(2)]
    runs = {}
    for form in ("in_place", "functional", "eager"):
        model = disable_dropout(spec.build("default", seed=0))
        if form != "eager":
            model = model.to("mncore")
        runs[form] = (model, spec.optimizer(model.parameters()))
    times: dict[str, list[float]] = {form: [] for form in runs}
    for i in range(warmup + steps):
        batch = batches[i % len(batches)]
        for form, (model, opt) in runs.items():
            with mncore.config.override(reinplace=form != "functional"):
                t0 = time.perf_counter()
                if form == "eager":
                    model_zoo.train_step(spec, model, opt, batch)
                else:
                    model_zoo.train_step(spec, model, opt, model_zoo.batch_to(batch, "mncore"))
                    mncore.sync()
                    mncore.wait_device_ops()
                if i >= warmup:
                    times[form].append(time.perf_counter() - t0)
    same = all(torch.equal(a.detach().cpu(), b.detach().cpu()) for a, b in
               zip(runs["in_place"][0].parameters(), runs["functional"][0].parameters()))
    med = {form: statistics.median(v) for form, v in times.items()}
    return {"model": model_name, "in_place_s": med["in_place"], "functional_s": med["functional"],
            "eager_s": med["eager"], "in_place/functional": med["in_place"] / med["functional"],
            "in_place/eager": med["in_place"] / med["eager"], "bit_identical": same, "steps": steps,
            "backend": "pfvm:cpu", "time": "measured wall time"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2_small,resnet18,mlp_w4096")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    a = ap.parse_args()
    rows = []
    for name in a.models.split(","):
        r = measure(name.strip(), a.steps)
        rows.append(r)
        print(f"{r['model']}: lazy step in place {r['in_place_s'] * 1e3:.0f} ms, functional "
              f"{r['functional_s'] * 1e3:.0f} ms, in place/functional {r['in_place/functional']:.2f}; eager PyTorch "
              f"{r['eager_s'] * 1e3:.0f} ms, in place/eager {r['in_place/eager']:.2f}; parameters bit-identical: "
              f"{r['bit_identical']} (medians of {r['steps']} steps, measured wall time, pfvm:cpu)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
