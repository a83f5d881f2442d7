"""Catalog candidates from torchvision's registry (``list_models``): classification, segmentation,
detection, video and optical flow, random weights (``weights=None``) and small inputs.

Torchvision's architectures have fixed widths, so they are not shrunk; the inputs are (64x64 images,
4-frame 64x64 clips, 128x128 image pairs), the class count is cut to 10, and detection models resize
their inputs to 64 pixels. An architecture that needs a larger input says so when the catalog is
collected (and is recorded as excluded with that reason).
"""
from __future__ import annotations

from functools import lru_cache

import torch

from model_zoo.spec import ModelSpec

PREFIX = "tv_"
SIZE, FRAMES, CLASSES = 64, 4, 10
FLOW_SIZE = 128  # RAFT's correlation pyramid needs feature maps of 16 (inputs of 8 x 16)
KINDS = ("classification", "segmentation", "detection", "video", "optical_flow")
TASKS = {"classification": "image-classification", "segmentation": "semantic-segmentation",
         "detection": "object-detection", "video": "video-classification", "optical_flow": "optical-flow"}


@lru_cache(maxsize=1)
def candidates() -> dict[str, tuple[str, str]]:
    """Catalog name -> (torchvision model name, kind), every builder of the kinds above."""
    import torchvision.models as tm

    modules = {"classification": tm, "segmentation": tm.segmentation, "detection": tm.detection,
               "video": tm.video, "optical_flow": tm.optical_flow}
    out: dict[str, tuple[str, str]] = {}
    for kind in KINDS:
        for name in tm.list_models(module=modules[kind]):
            out.setdefault(PREFIX + name, (name, kind))
    return out


def family(name: str) -> str:
    """The torchvision module that defines the builder (resnet, vgg, fcn, ...)."""
    import torchvision.models as tm

    return tm.get_model_builder(name).__module__.rsplit(".", 1)[-1]


def build(name: str, kind: str) -> torch.nn.Module:
    import torchvision.models as tm

    kwargs: dict = {"weights": None}
    if kind in ("classification", "video", "segmentation"):
        kwargs["num_classes"] = CLASSES
    if kind == "segmentation":
        kwargs.update(weights_backbone=None, aux_loss=False)
    if kind == "detection":
        kwargs.update(weights_backbone=None, num_classes=3, min_size=SIZE, max_size=SIZE)
    if name.startswith("vit_"):
        kwargs["image_size"] = SIZE
    if name.startswith(("googlenet", "inception")):
        kwargs.update(aux_logits=False, init_weights=True)
    return tm.get_model(name, **kwargs)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    kind = cfg["kind"]
    if kind == "video":
        return {"x": torch.randn(n, 3, FRAMES, SIZE, SIZE, generator=g), "y": torch.randint(0, CLASSES, (n,), generator=g)}
    if kind == "optical_flow":
        a, b, flow = (torch.randn(n, c, FLOW_SIZE, FLOW_SIZE, generator=g) for c in (3, 3, 2))
        return {"a": a, "b": b, "flow": flow}
    x = torch.randn(n, 3, SIZE, SIZE, generator=g)
    if kind == "segmentation":
        return {"x": x, "y": torch.randint(0, CLASSES, (n, SIZE, SIZE), generator=g)}
    if kind == "detection":  # one box per image (x0, y0 in the top-left quarter, x1, y1 beyond it)
        corner = torch.rand(n, 1, 2, generator=g) * SIZE / 2
        boxes = torch.cat([corner, corner + SIZE / 4 + torch.rand(n, 1, 2, generator=g) * SIZE / 4], dim=-1)
        return {"x": x, "boxes": boxes, "labels": torch.randint(1, 3, (n, 1), generator=g)}
    return {"x": x, "y": torch.randint(0, CLASSES, (n,), generator=g)}


def _loss_for(kind: str):
    def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
        f = torch.nn.functional
        if kind == "segmentation":
            return f.cross_entropy(model(b["x"])["out"], b["y"])
        if kind == "detection":
            targets = [{"boxes": bx, "labels": lb} for bx, lb in zip(b["boxes"], b["labels"])]
            return sum(model(list(b["x"]), targets).values())
        if kind == "optical_flow":
            return (model(b["a"], b["b"], num_flow_updates=2)[-1] - b["flow"]).abs().mean()
        out = model(b["x"])
        return f.cross_entropy(out if isinstance(out, torch.Tensor) else out[0], b["y"])
    return loss


def spec(name: str) -> ModelSpec:
    tv_name, kind = candidates()[name]
    return ModelSpec(
        name=name, family=family(tv_name), traits={"task": TASKS[kind]},
        configs={"tiny": {"name": tv_name, "kind": kind}}, batch_sizes={"tiny": 2},
        build_fn=build, batch_fn=batch, loss_fn=_loss_for(kind),
        optimizer_fn=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
        notes=f"torchvision {tv_name}, weights=None, {SIZE}x{SIZE} inputs", tags=("catalog", "torchvision"),
    )
