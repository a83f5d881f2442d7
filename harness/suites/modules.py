"""PyTorch's nn module database (``module_db``) as a suite: every module that supports float32 on the
CPU, its first ``cap`` inputs in training mode (and in eval mode too where the two differ), forward
outputs and the gradients of the inputs and parameters, against eager CPU (``harness.suites.check``).
The module is built on the CPU from one seed and moved with ``.to(device)``.
"""
from __future__ import annotations

import itertools
import time
from functools import lru_cache
from typing import Any

import torch

from harness.suites.check import Outcome, check, fresh, grad_leaves
from harness.suites.opinfo import DEFAULT_CAP, DTYPE, OpResult, describe, summarize


@lru_cache(maxsize=1)
def database() -> dict[str, Any]:
    """ModuleInfos supporting float32 on the CPU, by name (``nn.Linear``; variants get ``.variant``)."""
    from torch.testing._internal.common_modules import module_db

    out: dict[str, Any] = {}
    for info in module_db:
        if DTYPE in info.supported_dtypes("cpu"):
            name = info.name
            n = 2
            while name in out:
                name, n = f"{info.name}.{n}", n + 1
            out[name] = info
    return dict(sorted(out.items()))


def _build(info: Any, mi: Any, training: bool, device: str, double: bool) -> tuple:
    """(thunk, leaves): the module built from seed 0 on the CPU, moved to ``device`` with its inputs."""
    args, kwargs = mi.forward_input.args, mi.forward_input.kwargs
    with torch.random.fork_rng(devices=[]):  # the same weights every time; the forward uses the caller's seed
        torch.manual_seed(0)
        m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
    m.train(training)
    if double:
        m = m.double()
    if info.is_lazy:  # materialize the lazy parameters on the CPU first (both sides alike)
        with torch.no_grad():
            m(*fresh(args, "cpu", double), **fresh(kwargs, "cpu", double))
    m = m.to(device)
    a, k = fresh((args, kwargs), device, double)
    params = [p for p in m.parameters() if p.requires_grad]
    return (lambda: m(*a, **k)), grad_leaves((a, k)) + params


def run_module(name: str, device: str, *, cap: int = DEFAULT_CAP, backward: bool = True) -> OpResult:
    """Check the first ``cap`` inputs of module ``name`` (per training mode) on ``device``."""
    info = database()[name]
    t0 = time.perf_counter()
    modes = (True, False) if info.train_and_eval_differ else (True,)
    outcomes: list[tuple[str, Outcome]] = []
    for training in modes:
        torch.manual_seed(0)
        try:
            inputs = list(itertools.islice(info.module_inputs_func(info, device="cpu", dtype=DTYPE,
                                                                   requires_grad=backward, training=training), cap))
        except Exception as e:  # noqa: BLE001
            return OpResult(name, "eager_fail", message=f"input generation raises {type(e).__name__}: {e}"[:300])
        for i, mi in enumerate(inputs):
            if mi.forward_input is None:
                continue
            desc = (f"#{i}{' eval' if not training else ''} {mi.desc or ''} "
                    f"{describe(mi.constructor_input.args)} -> {describe(mi.forward_input.args)}")[:200]

            def make(dev: str, double: bool, mi: Any = mi, training: bool = training) -> tuple:
                return _build(info, mi, training, dev, double)

            try:
                make("cpu", False)[0]()
            except Exception:  # noqa: BLE001 - an input eager CPU itself rejects is no test
                continue
            outcomes.append((desc, check(make, device, backward=backward)))
    return summarize(name, outcomes, time.perf_counter() - t0, backward)
