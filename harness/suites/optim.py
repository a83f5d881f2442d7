"""PyTorch's optimizer database (``optim_db``) as a suite: every optimizer, its first ``cap`` inputs (the
database's own hyperparameter sets), each run as a for-loop, a ``foreach``, a ``capturable`` and a
``fused`` implementation where the optimizer has them; three ``step(closure)`` calls on a small model, then the
parameters, the optimizer's state and the last loss against eager CPU (``harness.suites.check``).

The model is a weight (10x5) and a bias (10) from seed 0, ``loss = (W @ x + b)².sum()`` on a fixed input:
the gradients come from backward on the device, as in training. An optimizer that takes 2-D parameters
only (Muon) gets the weight alone. The eager reference runs the same kwargs without ``capturable`` (a
CPU optimizer refuses it; it changes where the step count lives, not the maths). A fused implementation
is one ATen kernel per step (``_fused_adamw_``, ...), which mncore traces as any other op. Left out, with
why: sparse gradients (SparseAdam: mncore has no sparse layout), and the database's own ``fused=True``
inputs (its hyperparameter sets run as the fused implementation already).
"""
from __future__ import annotations

import itertools
import time
from functools import lru_cache
from typing import Any, Callable

import torch

from harness.suites.check import Outcome, check
from harness.suites.opinfo import DEFAULT_CAP, DTYPE, OpResult, describe, summarize

STEPS = 3  # optimizer steps per sample: the first makes the state, the next ones use it


@lru_cache(maxsize=1)
def database() -> dict[str, Any]:
    """The OptimizerInfos by optimizer class name, in sorted order."""
    from torch.testing._internal.common_optimizers import optim_db

    return dict(sorted((info.optim_cls.__name__, info) for info in optim_db))


def implementations(info: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, kwargs) of the implementations a sample runs: for-loop and foreach where the optimizer has a
    ``foreach`` flag (and capturable, on foreach, where it has that; fused where it has a fused kernel),
    else its only one."""
    if "foreach" not in info.supported_impls:
        return [("default", {})]
    impls = [("for-loop", {"foreach": False}), ("foreach", {"foreach": True})]
    if info.has_capturable_arg:
        impls.append(("capturable", {"foreach": True, "capturable": True}))
    if "fused" in info.supported_impls:
        impls.append(("fused", {"fused": True}))
    return impls


def _tensors(matrices_only: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The parameters' initial values and the input, from fixed seeds. Drawn before a sample runs: a
    random op inside it would make ``check`` take the sample's output for random and compare metadata only."""
    g = torch.Generator().manual_seed(0)
    shapes = [(10, 5)] if matrices_only else [(10, 5), (10,)]
    return [torch.randn(s, generator=g, dtype=DTYPE) for s in shapes], torch.randn(5, generator=g, dtype=DTYPE)


def _on(kwargs: dict[str, Any], dev: str) -> dict[str, Any]:
    """Tensor hyperparameters (a tensor ``lr``) on ``dev``: a capturable optimizer reads them there."""
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _train(info: Any, kwargs: dict[str, Any], dev: str, double: bool, matrices_only: bool) -> Callable[[], list]:
    """A thunk: the parameters and the optimizer on ``dev``, ``STEPS`` steps, then the parameters, every
    state tensor (by parameter, then key) and the last loss."""
    initial, x_host = _tensors(matrices_only)
    dtype = torch.float64 if double else DTYPE

    def run() -> list:
        params = [t.to(dtype).to(dev).requires_grad_() for t in initial]
        x = x_host.to(dtype).to(dev)
        opt = info.optim_cls(params, **kwargs)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            y = params[0] @ x + (params[1] if len(params) > 1 else 0)
            loss = y.pow(2).sum()
            loss.backward()
            return loss

        with torch.enable_grad():  # check() runs the thunk under no_grad
            loss = None
            for _ in range(STEPS):
                loss = opt.step(closure)
        state = [v for p in params for _, v in sorted(opt.state[p].items()) if isinstance(v, torch.Tensor)]
        return [p.detach() for p in params] + state + [loss.detach()]
    return run


def _matrices_only(info: Any) -> bool:
    """Whether the optimizer refuses 1-D parameters (Muon orthogonalises matrices)."""
    try:
        info.optim_cls([torch.zeros(3, requires_grad=True)])
    except ValueError:
        return True
    return False


def run_optimizer(name: str, device: str, *, cap: int = DEFAULT_CAP, backward: bool = True) -> OpResult:
    """Check the first ``cap`` inputs of optimizer ``name``, per implementation, on ``device``.
    (``backward`` is part of the suite interface: every sample here trains, so it always runs backward.)"""
    info = database()[name]
    t0 = time.perf_counter()
    if info.only_supports_sparse_grads:
        return OpResult(name, "skipped", message="sparse gradients only: mncore has no sparse layout")
    try:
        inputs = list(itertools.islice(info.optim_inputs_func(device="cpu", dtype=DTYPE), cap))
    except Exception as e:  # noqa: BLE001 - the database cannot make inputs in this torch
        return OpResult(name, "eager_fail", message=f"input generation raises {type(e).__name__}: {e}"[:300])
    matrices_only = _matrices_only(info)
    outcomes: list[tuple[str, Outcome]] = []
    for i, oi in enumerate(inputs):
        if oi.kwargs.get("fused"):
            continue
        for impl, extra in implementations(info):
            kwargs = {**oi.kwargs, **extra}
            reference = {k: v for k, v in kwargs.items() if k != "capturable"}
            desc = f"#{i} {oi.desc} [{impl}] {describe(oi.kwargs)}"[:200]

            def make(dev: str, double: bool, kwargs: dict = kwargs, reference: dict = reference) -> tuple:
                chosen = reference if dev == "cpu" else _on(kwargs, dev) if kwargs.get("capturable") else kwargs
                return _train(info, chosen, dev, double, matrices_only), []

            try:
                make("cpu", False)[0]()
            except Exception:  # noqa: BLE001 - an input eager CPU itself rejects is no test
                continue
            outcomes.append((desc, check(make, device, backward=False)))
    if inputs and not outcomes:
        return OpResult(name, "eager_fail", message="eager CPU rejects every input")
    return summarize(name, outcomes, time.perf_counter() - t0, False)
