"""ConvNeXt (torchvision ``ConvNeXt`` class, random weights).

Patchify stem (4x4 stride-4 conv), blocks of depthwise 7x7 conv + channels-last LayerNorm + Linear
(4x) + GELU + Linear with layer scale and stochastic depth, LayerNorm2d + 2x2 stride-2 downsampling
between stages. ``default`` is exactly ``torchvision.models.convnext_tiny`` (dims 96-768, depths
3-3-9-3, stochastic depth 0.1, 224x224, 1000 classes). ``tiny`` keeps every op but uses two narrow
stages (dims 32/64, depths 2/2) at 32x32 with 10 classes and stochastic depth 0 (lazy random streams
differ from eager CPU's, so the eager-vs-lazy check needs deterministic layers).
"""
from __future__ import annotations

import torch

from model_zoo.common import image_batch, classification_loss
from model_zoo.spec import ModelSpec


def build(dims: list[int], depths: list[int], num_classes: int = 1000, stochastic_depth_prob: float = 0.1,
          layer_scale: float = 1e-6, image_size: int = 224) -> torch.nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    del image_size  # only the batch uses it
    nxt = list(dims[1:]) + [None]
    setting = [CNBlockConfig(d, o, n) for d, o, n in zip(dims, nxt, depths)]
    return ConvNeXt(setting, stochastic_depth_prob=stochastic_depth_prob, layer_scale=layer_scale,
                    num_classes=num_classes)


SPECS = [ModelSpec(
    name="convnext_tiny", family="convnext",
    traits={"task": "classification", "norm": "layernorm", "activation": "gelu", "attention": "none",
            "embedding": "none", "conv": "depthwise", "recurrent": "no", "moe": "no"},
    configs={"tiny": {"dims": [32, 64], "depths": [2, 2], "num_classes": 10, "image_size": 32,
                      "stochastic_depth_prob": 0.0},
             "default": {"dims": [96, 192, 384, 768], "depths": [3, 3, 9, 3], "num_classes": 1000,
                         "image_size": 224, "stochastic_depth_prob": 0.1}},
    batch_sizes={"tiny": 4, "default": 32},
    build_fn=build, batch_fn=image_batch, loss_fn=classification_loss,
    optimizer_fn=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4),
    notes="default == torchvision convnext_tiny; tiny: 2 stages (32/64 channels, 2+2 blocks), 32x32, "
          "stochastic depth 0",
)]
