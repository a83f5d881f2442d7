"""Training recipes: what users' training code adds around an architecture, on small models.

The zoo and the catalog train every model with SGD and cross-entropy, and their architectures use only
some of ``torch.nn``'s layers. A user's training step also runs their optimizer (Adam, RMSprop, ..., in
its single-tensor, ``foreach`` or fused implementation), gradient clipping, their loss, and layers no
catalog model happens to have.
Each recipe here is one of those on a small model, so that the shape registry (``harness registry record
--recipes``) and the op tests generated from it cover the ops they run. Recipes are not architectures:
they are not in the catalog, its traits or the tiers. Names start with ``recipe_`` and have one config,
``tiny``.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

from model_zoo.spec import Batch, ModelSpec

PREFIX = "recipe_"
FEATURES, CLASSES, BATCH = 16, 4, 2

# torch.optim classes with the options that reach their less common code paths (name -> class, kwargs)
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adam": ("Adam", {}), "adam_amsgrad": ("Adam", {"amsgrad": True}), "adamw": ("AdamW", {}),
    "adamax": ("Adamax", {}), "nadam": ("NAdam", {}), "radam": ("RAdam", {}), "adagrad": ("Adagrad", {}),
    "adadelta": ("Adadelta", {}), "asgd": ("ASGD", {}), "rprop": ("Rprop", {}), "adafactor": ("Adafactor", {}),
    "rmsprop": ("RMSprop", {"momentum": 0.9, "centered": True}),
    "sgd_nesterov": ("SGD", {"lr": 0.01, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}),
}
# Each optimizer runs in its single-tensor, foreach and (where it has the flag) fused implementation.
FORMS: dict[str, dict[str, bool]] = {"single": {"foreach": False}, "foreach": {"foreach": True},
                                     "fused": {"fused": True}}


def _forms(cls: str) -> list[str]:
    """The implementations ``torch.optim.<cls>`` offers (fused only where its constructor takes the flag)."""
    takes = inspect.signature(getattr(torch.optim, cls)).parameters
    return [f for f, kw in FORMS.items() if all(k in takes for k in kw)]


CLIP_FORMS = ("single", "foreach")


def _clip_norm(params: list[nn.Parameter], foreach: bool) -> None:
    nn.utils.clip_grad_norm_(params, 1.0, foreach=foreach)


def _clip_value(params: list[nn.Parameter], foreach: bool) -> None:
    nn.utils.clip_grad_value_(params, 0.1, foreach=foreach)


CLIPPING: dict[str, Callable[[list[nn.Parameter], bool], None]] = {"norm": _clip_norm, "value": _clip_value}

# torch.nn losses whose ops the models' cross-entropy does not run, on the classifier's logits (n, CLASSES)
# and the batch's targets (see ``_batch``).
LOSSES: dict[str, Callable[[torch.Tensor, Batch], torch.Tensor]] = {
    "binary_cross_entropy": lambda o, b: F.binary_cross_entropy(torch.sigmoid(o), b["p"]),
    "kl_div": lambda o, b: F.kl_div(F.log_softmax(o, -1), b["dist"], reduction="batchmean"),
    "huber": lambda o, b: F.huber_loss(o, b["p"]),
    "soft_margin": lambda o, b: F.soft_margin_loss(o, b["sign"]),
    "multi_margin": lambda o, b: F.multi_margin_loss(o, b["y"]),
    "multilabel_margin": lambda o, b: F.multilabel_margin_loss(o, b["labels"]),
    "multilabel_soft_margin": lambda o, b: F.multilabel_soft_margin_loss(o, b["p"]),
    "cosine_embedding": lambda o, b: F.cosine_embedding_loss(o, b["p"], b["sign"][:, 0]),
    "triplet_margin": lambda o, b: F.triplet_margin_loss(o, o.roll(1, 0), b["p"]),
    "hinge_embedding": lambda o, b: F.hinge_embedding_loss(o, b["sign"]),
    "margin_ranking": lambda o, b: F.margin_ranking_loss(o[:, 0], o[:, 1], b["sign"][:, 0]),
}


class _Distances(nn.Module):
    """Pairwise and cumulative reductions over a linear projection (pdist, cdist, cosine, cumprod, ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.proj = kind, nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if self.kind == "pdist":
            return F.pdist(y).unsqueeze(0).expand(y.shape[0], -1)
        if self.kind == "cdist":
            return torch.cdist(y, y.flip(0))
        if self.kind == "cosine":
            return torch.stack([F.cosine_similarity(y, y.flip(0)), F.pairwise_distance(y, y.flip(0))], -1)
        return torch.cat([y.cumprod(-1), y.logcumsumexp(-1)], -1)


class _Bilinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Bilinear(FEATURES, FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, x.flip(-1))


class _EmbeddingBag(nn.Module):
    """Bags of four indices derived from the input's signs (the embedding weights get gradients)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.EmbeddingBag(16, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bits = (x[:, :16].detach() > 0).long().view(-1, 4, 4)
        return self.layer((bits * torch.tensor([1, 2, 4, 8], device=x.device)).sum(-1))


# torch.nn layers (and functions) whose ops no zoo or catalog model trains: name -> (factory, one sample's shape)
LAYERS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "elu": (nn.ELU, (FEATURES,)), "celu": (nn.CELU, (FEATURES,)),
    "mish": (nn.Mish, (FEATURES,)), "hardshrink": (nn.Hardshrink, (FEATURES,)),
    "softshrink": (nn.Softshrink, (FEATURES,)), "rrelu": (nn.RReLU, (FEATURES,)),
    "prelu": (nn.PReLU, (FEATURES,)), "logsigmoid": (nn.LogSigmoid, (FEATURES,)),
    "threshold": (lambda: nn.Threshold(0.1, 0.0), (FEATURES,)),
    "max_pool3d": (lambda: nn.MaxPool3d(2), (3, 4, 4, 4)), "avg_pool3d": (lambda: nn.AvgPool3d(2), (3, 4, 4, 4)),
    "adaptive_max_pool2d": (lambda: nn.AdaptiveMaxPool2d(3), (3, 6, 6)),
    "adaptive_max_pool3d": (lambda: nn.AdaptiveMaxPool3d(2), (3, 4, 4, 4)),
    "adaptive_avg_pool3d": (lambda: nn.AdaptiveAvgPool3d(2), (3, 4, 4, 4)),
    "fractional_max_pool2d": (lambda: nn.FractionalMaxPool2d(2, output_size=3), (3, 6, 6)),
    "fractional_max_pool3d": (lambda: nn.FractionalMaxPool3d(2, output_size=2), (3, 4, 4, 4)),
    "reflection_pad1d": (lambda: nn.ReflectionPad1d(2), (3, 8)),
    "reflection_pad3d": (lambda: nn.ReflectionPad3d(1), (3, 4, 4, 4)),
    "replication_pad1d": (lambda: nn.ReplicationPad1d(2), (3, 8)),
    "replication_pad2d": (lambda: nn.ReplicationPad2d(1), (3, 6, 6)),
    "replication_pad3d": (lambda: nn.ReplicationPad3d(1), (3, 4, 4, 4)),
    "upsample_nearest1d": (lambda: nn.Upsample(scale_factor=2), (3, 8)),
    "upsample_linear1d": (lambda: nn.Upsample(scale_factor=2, mode="linear"), (3, 8)),
    "upsample_nearest3d": (lambda: nn.Upsample(scale_factor=2), (3, 2, 2, 2)),
    "upsample_trilinear3d": (lambda: nn.Upsample(scale_factor=2, mode="trilinear"), (3, 2, 2, 2)),
    "channel_shuffle": (lambda: nn.ChannelShuffle(3), (6, 2, 2)),
    "alpha_dropout": (nn.AlphaDropout, (FEATURES,)), "feature_alpha_dropout": (nn.FeatureAlphaDropout, (3, 8)),
    "bilinear": (_Bilinear, (FEATURES,)), "embedding_bag": (_EmbeddingBag, (FEATURES,)),
    "pdist": (lambda: _Distances("pdist"), (FEATURES,)), "cdist": (lambda: _Distances("cdist"), (FEATURES,)),
    "cosine_similarity": (lambda: _Distances("cosine"), (FEATURES,)),
    "cumulative": (lambda: _Distances("cumulative"), (FEATURES,)),
}


class _LayerNet(nn.Module):
    """A learnable input scale (so the layer's input gets a gradient), the layer, a linear classifier."""

    def __init__(self, layer: nn.Module, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.scale, self.layer = nn.Parameter(torch.ones(shape)), layer
        with torch.no_grad():
            out = layer.eval()(torch.randn(BATCH, *shape)).shape
        layer.train()
        self.head = nn.Linear(out[1:].numel(), CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x * self.scale).flatten(1))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.Tanh(), nn.Linear(FEATURES, CLASSES))


def _build(recipe: str) -> nn.Module:
    kind, _, what = recipe.partition("_")
    if kind == "layer":
        make, shape = LAYERS[what]
        return _LayerNet(make(), shape)
    return _mlp()


def _batch(cfg: dict, n: int, g: torch.Generator) -> Batch:
    """Inputs of the recipe's shape and one target of each kind the losses need."""
    kind, _, what = cfg["recipe"].partition("_")
    shape = LAYERS[what][1] if kind == "layer" else (FEATURES,)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    labels = torch.full((n, CLASSES), -1)
    labels[:, 0], labels[:, 1] = y, (y + 1) % CLASSES  # two labels per sample, then the -1 terminator
    p = torch.rand(n, CLASSES, generator=g)
    return {"x": torch.randn(n, *shape, generator=g), "y": y, "labels": labels, "p": p,
            "dist": p / p.sum(-1, keepdim=True), "sign": torch.randint(0, 2, (n, CLASSES), generator=g) * 2.0 - 1}


def _loss_fn(recipe: str) -> Callable[[nn.Module, Batch], torch.Tensor]:
    kind, _, what = recipe.partition("_")
    if kind == "loss":
        return lambda model, b: LOSSES[what](model(b["x"]), b)
    return lambda model, b: F.cross_entropy(model(b["x"]), b["y"])


def _optimizer_fn(recipe: str) -> Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]:
    """The recipe's optimizer; a clipping recipe clips in the optimizer's step pre-hook (between
    backward and the update, where training code calls it)."""
    kind, _, what = recipe.partition("_")
    if kind == "optim":
        name, form = what.rsplit("_", 1)
        cls, kwargs = OPTIMIZERS[name]
        return lambda params: getattr(torch.optim, cls)(params, **kwargs, **FORMS[form])
    if kind == "clip":
        how, form = what.rsplit("_", 1)

        def make(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
            params = list(params)
            opt = torch.optim.SGD(params, lr=0.01)
            opt.register_step_pre_hook(lambda *_: CLIPPING[how](params, form == "foreach"))
            return opt
        return make
    return lambda params: torch.optim.SGD(params, lr=0.01)


@lru_cache(maxsize=1)
def candidates() -> tuple[str, ...]:
    """Every recipe name: optimizers and clipping in each implementation, losses, layers."""
    names = [f"optim_{o}_{f}" for o, (cls, _) in OPTIMIZERS.items() for f in _forms(cls)]
    names += [f"clip_{c}_{f}" for c in CLIPPING for f in CLIP_FORMS]
    names += [f"loss_{n}" for n in LOSSES] + [f"layer_{n}" for n in LAYERS]
    return tuple(PREFIX + n for n in names)


def spec(name: str) -> ModelSpec:
    """The recipe ``name`` (one of ``candidates()``) as a zoo spec with a single ``tiny`` config."""
    if name not in candidates():
        raise KeyError(f"unknown recipe {name!r}; known: {', '.join(candidates())}")
    recipe = name.removeprefix(PREFIX)
    return ModelSpec(name=name, family="recipe", traits={"task": "classification"},
                     configs={"tiny": {"recipe": recipe}}, batch_sizes={"tiny": BATCH},
                     build_fn=_build, batch_fn=_batch, loss_fn=_loss_fn(recipe),
                     optimizer_fn=_optimizer_fn(recipe), notes=f"training recipe {recipe}", tags=("recipe",))
