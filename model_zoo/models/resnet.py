"""torchvision ResNet-18 (batch 32, 224x224 by default), random weights."""
from __future__ import annotations

import torch

from model_zoo.common import image_batch, classification_loss
from model_zoo.spec import ModelSpec


def build(num_classes: int = 1000, **_: object) -> torch.nn.Module:
    import torchvision

    return torchvision.models.resnet18(weights=None, num_classes=num_classes)


SPECS = [ModelSpec(
    name="resnet18", family="cnn",
    traits={"task": "classification", "norm": "batchnorm", "activation": "relu", "attention": "none",
            "embedding": "none", "conv": "yes", "recurrent": "no", "moe": "no"},
    configs={"tiny": {"num_classes": 10, "image_size": 32}, "default": {"num_classes": 1000, "image_size": 224}},
    batch_sizes={"tiny": 2, "default": 32},
    build_fn=build, batch_fn=image_batch, loss_fn=classification_loss,
    notes="seed 000: lazy/Context 1.05x at batch 32", tags=("headline",),
)]
