"""Vision transformers from torchvision's ``VisionTransformer`` and ``SwinTransformer`` classes (random weights).

``vit_b_16``: patchify conv, class token, learned position embedding, pre-LayerNorm encoder blocks
with ``nn.MultiheadAttention`` (which calls ``scaled_dot_product_attention`` with ``need_weights=False``)
and a GELU MLP; ``default`` is exactly ``torchvision.models.vit_b_16`` (224x224, patch 16, 12 x 768).
``swin_t``: 4x4 patchify conv, shifted-window attention with a learned relative-position bias table
(the shift builds its attention mask from the feature-map size with index writes, no value reads),
patch merging between stages; ``default`` is exactly ``torchvision.models.swin_t``. Tiny configs use
the same classes with small dims at 32x32, 10 classes and stochastic depth 0 (Swin's 8x8 first stage
with window 4 still shifts and masks; the 4x4 second stage is a single unshifted window).
Both train with AdamW (weight decay 0.05, the DeiT/Swin recipe).
"""
from __future__ import annotations

import torch

from model_zoo.common import image_batch, classification_loss
from model_zoo.spec import ModelSpec


def build_vit(image_size: int, patch_size: int, num_layers: int, num_heads: int, hidden_dim: int, mlp_dim: int,
              num_classes: int = 1000, dropout: float = 0.0) -> torch.nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                             num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim,
                             num_classes=num_classes, dropout=dropout)


def build_swin(patch_size: list[int], embed_dim: int, depths: list[int], num_heads: list[int],
               window_size: list[int], num_classes: int = 1000, stochastic_depth_prob: float = 0.2,
               image_size: int = 224) -> torch.nn.Module:
    from torchvision.models import SwinTransformer

    del image_size  # only the batch uses it
    return SwinTransformer(patch_size=patch_size, embed_dim=embed_dim, depths=depths, num_heads=num_heads,
                           window_size=window_size, stochastic_depth_prob=stochastic_depth_prob,
                           num_classes=num_classes)


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)


SPECS = [
    ModelSpec(
        name="vit_b_16", family="vision-transformer",
        traits={"task": "classification", "norm": "layernorm", "activation": "gelu", "attention": "bidirectional-mha",
                "embedding": "patch+learned-position", "conv": "patchify", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"image_size": 32, "patch_size": 8, "num_layers": 2, "num_heads": 2, "hidden_dim": 64,
                          "mlp_dim": 128, "num_classes": 10},
                 "default": {"image_size": 224, "patch_size": 16, "num_layers": 12, "num_heads": 12,
                             "hidden_dim": 768, "mlp_dim": 3072, "num_classes": 1000}},
        batch_sizes={"tiny": 2, "default": 16},
        build_fn=build_vit, batch_fn=image_batch, loss_fn=classification_loss, optimizer_fn=_adamw,
        notes="default == torchvision vit_b_16; tiny: 32x32, patch 8 (16 tokens + class token), 2 x 64-wide layers",
    ),
    ModelSpec(
        name="swin_t", family="vision-transformer",
        traits={"task": "classification", "norm": "layernorm", "activation": "gelu", "attention": "shifted-window",
                "embedding": "patch+relative-bias", "conv": "patchify", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"patch_size": [4, 4], "embed_dim": 32, "depths": [2, 2], "num_heads": [2, 4],
                          "window_size": [4, 4], "num_classes": 10, "image_size": 32, "stochastic_depth_prob": 0.0},
                 "default": {"patch_size": [4, 4], "embed_dim": 96, "depths": [2, 2, 6, 2], "num_heads": [3, 6, 12, 24],
                             "window_size": [7, 7], "num_classes": 1000, "image_size": 224,
                             "stochastic_depth_prob": 0.2}},
        batch_sizes={"tiny": 2, "default": 16},
        build_fn=build_swin, batch_fn=image_batch, loss_fn=classification_loss, optimizer_fn=_adamw,
        notes="default == torchvision swin_t; tiny: 32x32, embed 32, depths 2/2, window 4 (stage 1 shifted+masked)",
    ),
]
