"""Batch and loss functions shared by several model families."""
from __future__ import annotations

import torch


def image_batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    """Random NCHW images of ``cfg["image_size"]`` with class labels below ``cfg["num_classes"]``."""
    s = cfg["image_size"]
    return {"x": torch.randn(n, 3, s, s, generator=g), "y": torch.randint(0, cfg["num_classes"], (n,), generator=g)}


def classification_loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(b["x"]), b["y"])
