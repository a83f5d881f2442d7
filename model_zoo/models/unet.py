"""U-Net (plain torch): conv encoder-decoder with skip connections for per-pixel classification.

Encoder: [3x3 conv (no bias) + BatchNorm + ReLU] x 2 per level, 2x2 max-pool between levels;
decoder: 2x2 stride-2 ``ConvTranspose2d`` up-sampling, concatenation with the encoder feature map of
the same resolution, the same double conv; a 1x1 conv to class logits; loss = per-pixel cross-entropy
against an (N, H, W) label map. ``default`` is the common padded U-Net (Ronneberger et al. widths
64..1024, 4 down/up levels, 31M parameters; e.g. milesial/Pytorch-UNet) at 256x256 with 21 classes
(Pascal VOC), batch 4; ``tiny``: widths 8..32 (2 levels) at 32x32 with 4 classes.
"""
from __future__ import annotations

import torch
from torch import nn

from model_zoo.spec import ModelSpec


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    def __init__(self, in_channels: int = 3, num_classes: int = 2, base: int = 64, depth: int = 4) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(depth + 1)]
        self.inc = _double_conv(in_channels, widths[0])
        self.downs = nn.ModuleList(nn.Sequential(nn.MaxPool2d(2), _double_conv(widths[i], widths[i + 1]))
                                   for i in range(depth))
        self.ups = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                 for i in reversed(range(depth)))
        self.up_convs = nn.ModuleList(_double_conv(2 * widths[i], widths[i]) for i in reversed(range(depth)))
        self.outc = nn.Conv2d(widths[0], num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        x = skips.pop()
        for up, conv in zip(self.ups, self.up_convs):
            x = conv(torch.cat([skips.pop(), up(x)], dim=1))
        return self.outc(x)


def build(in_channels: int = 3, num_classes: int = 2, base: int = 64, depth: int = 4,
          image_size: int = 256) -> nn.Module:
    del image_size  # only the batch uses it (must be divisible by 2 ** depth)
    return UNet(in_channels, num_classes, base, depth)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    s, c = cfg["image_size"], cfg.get("in_channels", 3)
    return {"x": torch.randn(n, c, s, s, generator=g),
            "y": torch.randint(0, cfg["num_classes"], (n, s, s), generator=g)}


def loss(model: nn.Module, b: dict) -> torch.Tensor:
    return nn.functional.cross_entropy(model(b["x"]), b["y"])


SPECS = [ModelSpec(
    name="unet", family="unet",
    traits={"task": "segmentation", "norm": "batchnorm", "activation": "relu", "attention": "none",
            "embedding": "none", "conv": "transposed", "recurrent": "no", "moe": "no"},
    configs={"tiny": {"in_channels": 3, "num_classes": 4, "base": 8, "depth": 2, "image_size": 32},
             "default": {"in_channels": 3, "num_classes": 21, "base": 64, "depth": 4, "image_size": 256}},
    batch_sizes={"tiny": 2, "default": 4},
    build_fn=build, batch_fn=batch, loss_fn=loss,
    optimizer_fn=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4),
    notes="padded U-Net: max-pool down, ConvTranspose2d up, skip concatenation, per-pixel cross-entropy",
)]
