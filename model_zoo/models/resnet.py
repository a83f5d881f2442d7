"""torchvision ResNet-18 (batch 32, 224x224 by default), random weights."""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec


def build(num_classes: int = 1000, **_: object) -> torch.nn.Module:
    import torchvision

    return torchvision.models.resnet18(weights=None, num_classes=num_classes)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    s = cfg["image_size"]
    return {"x": torch.randn(n, 3, s, s, generator=g), "y": torch.randint(0, cfg["num_classes"], (n,), generator=g)}


def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(b["x"]), b["y"])


SPECS = [ModelSpec(
    name="resnet18", family="cnn",
    traits={"task": "classification", "norm": "batchnorm", "activation": "relu", "attention": "none",
            "embedding": "none", "conv": "yes", "recurrent": "no", "moe": "no"},
    configs={"tiny": {"num_classes": 10, "image_size": 32}, "default": {"num_classes": 1000, "image_size": 224}},
    batch_sizes={"tiny": 2, "default": 32},
    build_fn=build, batch_fn=batch, loss_fn=loss,
    notes="seed 000: lazy/Context 1.05x at batch 32", tags=("headline",),
)]
