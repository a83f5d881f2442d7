"""What a zoo model is: how to build it from a config with a seed, feed it and train it.

Specs never run anything on a backend; runners (harness) and recorders (shape_registry) call
``build``/``make_batch``/``loss``/``optimizer`` on whatever device they choose.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs; nothing is downloaded

Batch = dict[str, torch.Tensor]

# The trait vocabulary; `harness zoo list` shows these columns and the models tier covers each value.
TRAIT_KEYS = ("task", "norm", "activation", "attention", "embedding", "conv", "recurrent", "moe")


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry. ``configs`` maps a config name ("tiny", "default", ...) to builder kwargs."""

    name: str
    family: str
    traits: dict[str, str]
    configs: dict[str, dict[str, Any]]
    batch_sizes: dict[str, int]
    build_fn: Callable[..., torch.nn.Module]
    batch_fn: Callable[[dict[str, Any], int, torch.Generator], Batch]
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor]
    optimizer_fn: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer] = (
        lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9))
    notes: str = ""
    tags: tuple[str, ...] = field(default=())

    def config(self, config: str) -> dict[str, Any]:
        try:
            return self.configs[config]
        except KeyError:
            raise KeyError(f"model {self.name!r} has no config {config!r}; it has {', '.join(self.configs)}") from None

    def build(self, config: str = "tiny", seed: int = 0) -> torch.nn.Module:
        """A freshly initialised model (random weights from ``seed``), in train mode, on CPU."""
        cfg = self.config(config)
        torch.manual_seed(seed)
        model = self.build_fn(**cfg)
        return model.train()

    def make_batch(self, config: str = "tiny", batch_size: int | None = None, seed: int = 0) -> Batch:
        """A deterministic CPU batch (inputs and targets) for ``config``."""
        cfg = self.config(config)
        g = torch.Generator().manual_seed(seed)
        return self.batch_fn(cfg, batch_size or self.batch_sizes[config], g)

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return self.loss_fn(model, batch)

    def optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return self.optimizer_fn(params)

    def parameter_count(self, config: str = "tiny") -> int:
        return sum(p.numel() for p in self.build(config).parameters())


def batch_to(batch: Batch, device: str | torch.device) -> Batch:
    """The batch on ``device``; to mncore with ``.mncore()``, as the seed programs upload theirs."""
    if str(device) == "mncore":
        return {k: v.mncore() for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def train_step(spec: ModelSpec, model: torch.nn.Module, opt: torch.optim.Optimizer, batch: Batch) -> torch.Tensor:
    """One training step as every runner does it: zero_grad, loss, backward, step."""
    opt.zero_grad()
    loss = spec.loss(model, batch)
    loss.backward()
    opt.step()
    return loss
