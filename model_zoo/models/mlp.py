"""The seed's MLP sweep: 4 x [Linear(w, w) + ReLU] then a classifier, batch 64."""
from __future__ import annotations

import torch

from model_zoo.common import classification_loss
from model_zoo.spec import ModelSpec

WIDTHS = (64, 128, 256, 512, 1024, 2048, 4096)


def build(width: int, depth: int = 4, classes: int = 10) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, classes))


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    return {"x": torch.randn(n, cfg["width"], generator=g), "y": torch.randint(0, cfg.get("classes", 10), (n,), generator=g)}


def _spec(width: int) -> ModelSpec:
    return ModelSpec(
        name=f"mlp_w{width}", family="mlp",
        traits={"task": "classification", "norm": "none", "activation": "relu", "attention": "none",
                "embedding": "none", "conv": "no", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"width": width}, "default": {"width": width}},
        batch_sizes={"tiny": 64, "default": 64},
        build_fn=build, batch_fn=batch, loss_fn=classification_loss,
        optimizer_fn=lambda params: torch.optim.SGD(params, lr=0.1),
        notes="seed 000: lazy vs Context API as width grows", tags=("mlp_sweep",),
    )


SPECS = [_spec(w) for w in WIDTHS]
