"""Run the same training loop eagerly on CPU and lazily on mncore, and compare."""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch

import mncore


def train(model: torch.nn.Module, batches: list, device: str, make_opt: Callable, loss_fn: Callable,
          steps: int | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Train ``model`` (a deep copy is made) on ``device``; returns losses and final state on CPU."""
    model = copy.deepcopy(model).to(device)
    opt = make_opt(model.parameters())
    losses = []
    for batch in batches[:steps]:
        batch = [b.to(device) for b in batch]
        opt.zero_grad()
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        if device == "mncore":
            mncore.sync()
        losses.append(loss)
    losses = [float(l.detach().cpu()) for l in losses]
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def assert_same_training(eager: tuple, lazy: tuple, rtol: float, atol: float) -> None:
    torch.testing.assert_close(torch.tensor(lazy[0]), torch.tensor(eager[0]), rtol=rtol, atol=atol)
    assert eager[1].keys() == lazy[1].keys()
    for k in eager[1]:
        torch.testing.assert_close(lazy[1][k], eager[1][k], rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")


def mlp(width: int, depth: int = 4, classes: int = 10) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def ce(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


def eager_seed_mlp_train() -> tuple[float, torch.Tensor]:
    """examples/context/mlp_train.py run eagerly: its last loss and ``model[2].bias`` (nothing between
    the loader and the model draws random numbers, so the seeds line up)."""
    torch.manual_seed(0)
    loader = [{"x": torch.randn(64, 512), "y": torch.randint(0, 10, (64,))} for _ in range(20)]
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        loss.backward()
        opt.step()
    return loss.item(), model[2].bias.detach()


def counter_delta(before: dict, *names: str) -> dict:
    """How much each of ``names`` in ``mncore.metrics.counters()`` grew since ``before``."""
    now = mncore.metrics.counters()
    return {n: now[n] - before[n] for n in names}


def capture_warning_messages(rec: list) -> list[str]:
    """The messages of the ``CaptureWarning``s among recorded warnings (step capture tests)."""
    return [str(w.message) for w in rec if issubclass(w.category, mncore.CaptureWarning)]


def cpu_copy(x: Any) -> Any:
    """Tensors in ``x`` (nested in dicts, lists, tuples) copied to the CPU: a record that a tensor changed
    in place later cannot change."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: cpu_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(cpu_copy(v) for v in x)
    return x


def dict_train_step(model: torch.nn.Module, opt: torch.optim.Optimizer,
                    loss_fn: Callable = torch.nn.functional.cross_entropy) -> Callable[[dict], dict]:
    """The ``dict -> dict`` training step the Context API compiles (batch keys ``x`` and ``y``)."""
    def train_step(batch: dict) -> dict:
        opt.zero_grad()
        loss = loss_fn(model(batch["x"]), batch["y"])
        loss.backward()
        opt.step()
        return {"loss": loss}
    return train_step


def fake_run_models(rows: list) -> Callable:
    """A ``harness.tiers.run_models`` that hands back ``rows`` (``ModelRow``s) as if their cells had just finished."""
    def run_models(*args: Any, on_row: Callable | None = None, **kwargs: Any) -> list:
        for r in rows:
            on_row(r)
        return rows

    return run_models


def doubling_with_backward(backward: Callable[[torch.Tensor], torch.Tensor]) -> type[torch.autograd.Function]:
    """An autograd Function whose forward doubles its input and whose backward is ``backward(grad)``: the
    tests' way to put a chosen op (a failing one, a data-dependent one) into backward only."""

    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return backward(g)

    return Doubling
