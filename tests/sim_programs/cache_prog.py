"""A small training program run as a subprocess by tests/test_disk_cache.py.

Lazy mode (SGD with momentum, 3 steps: two distinct graphs) and the Context API (one compiled
step, 3 calls) on ``emu2``. The lazy part uses ``MNCORE_CACHE_DIR`` from the environment, the
Context part ``CacheOptions(argv[2])``. Prints one JSON line: the metric deltas of each part,
the names of the graphs each part needed, the losses and the final parameters.

``CACHE_PROG_BARRIER=DIR`` and ``CACHE_PROG_BARRIER_N=N`` make N processes wait for each
other before each part, so that they need the same graphs at the same moment.
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
import sys
import time

import torch

import mncore
from mncore.context import (CacheOptions, Context, MNCoreSGD, MNDevice, set_buffer_name_in_optimizer,
                            set_tensor_name_in_module, storage)
from mncore.cache import memory as compile_cache

COUNTERS = ("compiles", "disk_cache_hits", "disk_cache_misses", "disk_cache_corrupt", "cache_hits")


def barrier(name: str) -> None:
    root = os.environ.get("CACHE_PROG_BARRIER")
    if not root:
        return
    n = int(os.environ.get("CACHE_PROG_BARRIER_N", "1"))
    d = pathlib.Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    (d / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(d.iterdir())) < n and time.monotonic() < deadline:
        time.sleep(0.005)


def snapshot() -> dict:
    c = mncore.metrics.counters()
    return {k: c.get(k, 0) for k in COUNTERS}


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in COUNTERS}


def model_and_data() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    batches = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(3)]
    return model, batches


def run(codegen_dir: str, ctx_cache: str) -> dict:
    """Both parts; the lazy part's cache is ``MNCORE_CACHE_DIR``. Leaves ``emu2`` and the context current."""
    mncore.init("emu2")
    model, batches = model_and_data()

    # -- lazy mode ------------------------------------------------------------------------------
    lazy_model = copy.deepcopy(model).mncore()
    opt = torch.optim.SGD(lazy_model.parameters(), lr=0.1, momentum=0.9)
    barrier("lazy")
    m0 = snapshot()
    compile_cache.clear()  # (a no-op in a fresh process)
    lazy_losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lazy_model(x.mncore()), y.mncore())
        loss.backward()
        opt.step()
        mncore.sync()
        lazy_losses.append(loss)
    mncore.wait_device_ops()
    lazy_losses = [loss.item() for loss in lazy_losses]
    lazy_params = [p.detach().cpu().tolist() for p in lazy_model.parameters()]
    m1 = snapshot()
    lazy_names = sorted(exe.name for exe in compile_cache.values())

    # -- Context API ----------------------------------------------------------------------------
    ctx_model = copy.deepcopy(model)
    context = Context(MNDevice("emu2"))
    Context.switch_context(context)
    ctx_opt = MNCoreSGD(ctx_model.parameters(), lr=0.1, momentum=0.9)
    set_tensor_name_in_module(ctx_model, "model")
    set_buffer_name_in_optimizer(ctx_opt, "opt")
    for p in ctx_model.parameters():
        context.register_param(p)
    context.register_optimizer_buffers(ctx_opt)

    def train_step(batch: dict) -> dict:
        ctx_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ctx_model(batch["x"]), batch["y"])
        loss.backward()
        ctx_opt.step()
        return {"loss": loss}

    barrier("context")
    m2 = snapshot()
    step = context.compile(train_step, {"x": batches[0][0], "y": batches[0][1]}, storage.path(codegen_dir),
                           cache_options=CacheOptions(ctx_cache))
    ctx_losses = [step({"x": x, "y": y})["loss"].item() for x, y in batches]
    context.synchronize()
    m3 = snapshot()
    ctx_names = sorted(set(exe.name for exe in compile_cache.values()) - set(lazy_names))
    return {
        "pid": os.getpid(),
        "lazy": {"metrics": delta(m1, m0), "graphs": lazy_names, "losses": lazy_losses, "params": lazy_params},
        "context": {"metrics": delta(m3, m2), "graphs": ctx_names, "losses": ctx_losses,
                    "params": [p.detach().tolist() for p in ctx_model.parameters()]},
    }


def main() -> None:
    print(json.dumps(run(sys.argv[1], sys.argv[2])))


if __name__ == "__main__":
    main()
