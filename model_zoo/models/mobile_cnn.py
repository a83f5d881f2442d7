"""Mobile CNNs from torchvision (random weights): MobileNetV3-small and EfficientNet-B0.

Both are inverted-residual (MBConv) networks: 1x1 expand, depthwise 3x3/5x5, squeeze-excitation,
1x1 project, batch norm; MobileNetV3 uses hardswish (hardsigmoid gates), EfficientNet SiLU (sigmoid
gates) and stochastic depth. Tiny configs are the full architectures at 32x32 with 10 classes and
dropout / stochastic depth 0 (lazy random streams differ from eager CPU's, so the eager-vs-lazy loss
check needs deterministic layers); default configs are torchvision's (224x224, 1000 classes,
dropout 0.2, EfficientNet stochastic depth 0.2), batch 32 as for ResNet-18.
"""
from __future__ import annotations

import torch

from model_zoo.common import image_batch, classification_loss
from model_zoo.spec import ModelSpec


def build(arch: str, num_classes: int = 1000, image_size: int = 224, **kwargs: object) -> torch.nn.Module:
    import torchvision

    del image_size  # only the batch uses it; both networks end in adaptive average pooling
    return getattr(torchvision.models, arch)(weights=None, num_classes=num_classes, **kwargs)


def _sgd(params):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-5)


def _sgd_slow(params):
    """efficientnet_b0 at batch 4 diverges at lr 0.01 (loss 7 -> 26 in 6 steps, float32 and float64 apart by
    1e4 by then), which leaves nothing to judge; at 1e-3 it trains."""
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, weight_decay=1e-5)


_TRAITS = {"task": "classification", "norm": "batchnorm", "attention": "squeeze-excite", "embedding": "none",
           "conv": "depthwise", "recurrent": "no", "moe": "no"}

SPECS = [
    ModelSpec(
        name="mobilenet_v3_small", family="mobile-cnn",
        traits={**_TRAITS, "activation": "hardswish"},
        configs={"tiny": {"arch": "mobilenet_v3_small", "num_classes": 10, "image_size": 32, "dropout": 0.0},
                 "default": {"arch": "mobilenet_v3_small", "num_classes": 1000, "image_size": 224}},
        batch_sizes={"tiny": 4, "default": 32},
        build_fn=build, batch_fn=image_batch, loss_fn=classification_loss, optimizer_fn=_sgd,
        notes="torchvision mobilenet_v3_small: depthwise convs, squeeze-excitation (hardsigmoid), hardswish; "
              "tiny = full network at 32x32 (final feature map 1x1), dropout 0",
    ),
    ModelSpec(
        name="efficientnet_b0", family="mobile-cnn",
        traits={**_TRAITS, "activation": "silu"},
        configs={"tiny": {"arch": "efficientnet_b0", "num_classes": 10, "image_size": 32, "dropout": 0.0,
                          "stochastic_depth_prob": 0.0},
                 "default": {"arch": "efficientnet_b0", "num_classes": 1000, "image_size": 224}},
        batch_sizes={"tiny": 4, "default": 32},
        build_fn=build, batch_fn=image_batch, loss_fn=classification_loss, optimizer_fn=_sgd_slow,
        notes="torchvision efficientnet_b0: MBConv with squeeze-excitation, SiLU, stochastic depth 0.2 by default; "
              "tiny = full network at 32x32, dropout and stochastic depth 0",
    ),
]
