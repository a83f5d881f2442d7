"""Values some CPU kernels trust, checked before those kernels run on mncore's device buffers.

A few CPU kernels index memory by the values of an argument without checking them, because the public
op above them has (``F.embedding`` checks its indices; CTC's backward "assumes that the forward did"),
or never does (CTC's target labels). Called with other values, they read and write past the ends of
mncore's exactly sized device buffers and the process dies later, in some other op (found by fuzzing;
eager reads the same wrong memory, often inside a larger allocation). These are values, so the checks
run with the kernel, on the graph's real tensors, and raise ``ValueError`` naming the argument.

- CTC: ``_ctc_loss`` and ``_ctc_loss_backward`` index ``log_probs`` and the gradient they write by the
  labels each sequence uses, and the backward op fills a tensor shaped like ``log_alpha``.
- Embedding backward ops scatter into a gradient of ``num_weights`` rows by ``indices``.
- Max-pooling backward ops scatter into each plane of the input's gradient by ``indices``.
- torchvision's RoI ops read (and their backward ops write) the image that column 0 of each box names.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from mncore.ir.ops import named_args

aten = torch.ops.aten


def _first_outside(values: torch.Tensor, end: int) -> int | None:
    """The first of ``values`` outside ``[0, end)``, or None."""
    bad = values[(values < 0) | (values >= end)]
    return int(bad[0]) if bad.numel() else None


def _lengths(x: Any) -> list[int]:
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


def check_ctc_arguments(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: Any, target_lengths: Any,
                        log_alpha: torch.Tensor | None = None, per_sequence: tuple = ()) -> None:
    """Raise ``ValueError`` naming the first argument CPU's CTC kernels would read or write past."""
    if log_probs.dim() != 3 or targets.dim() not in (1, 2):
        return  # the kernels' own shape checks refuse these
    steps, batch, classes = log_probs.shape
    ins, outs = _lengths(input_lengths), _lengths(target_lengths)
    for name, values in (("input_lengths", ins), ("target_lengths", outs)):
        if len(values) != batch:
            raise ValueError(f"mncore: ctc_loss: {name} holds {len(values)} values for a batch of {batch}; "
                             "pass one per sequence")
    if any(not 0 <= n <= steps for n in ins):
        raise ValueError(f"mncore: ctc_loss: input_lengths must lie in [0, {steps}] (log_probs has {steps} steps), "
                         f"got {ins}")
    room = targets.size(1) if targets.dim() == 2 else targets.numel()
    if any(n < 0 for n in outs) or (max(outs, default=0) if targets.dim() == 2 else sum(outs)) > room:
        raise ValueError(f"mncore: ctc_loss: target_lengths {outs} ask for more labels than targets of shape "
                         f"{list(targets.shape)} hold")
    if targets.dim() == 2:
        used = targets[torch.arange(targets.size(1), device=targets.device)
                       < torch.tensor(outs, device=targets.device).unsqueeze(1)]
    else:
        used = targets[:sum(outs)]
    label = _first_outside(used, classes)
    if label is not None:
        raise ValueError(f"mncore: ctc_loss: target label {label} is not a class of log_probs, which has "
                         f"{classes} (labels 0..{classes - 1}, the blank included); check the number of classes")
    if log_alpha is None:
        return
    need = (batch, max(ins, default=0), 2 * max(outs, default=0) + 1)
    if log_alpha.dim() != 3 or any(h < n for h, n in zip(log_alpha.shape, need)):
        raise ValueError(f"mncore: ctc_loss_backward: log_alpha of shape {list(log_alpha.shape)} is smaller than "
                         f"these targets need {list(need)}; pass the log_alpha the forward op returned")
    for name, t in per_sequence:
        if t.numel() < batch:
            raise ValueError(f"mncore: ctc_loss_backward: {name} holds {t.numel()} values for a batch of {batch}")


def check_rows(op: str, indices: torch.Tensor, num_weights: int) -> None:
    """Embedding backward: every index names a row of the ``num_weights``-row gradient."""
    index = _first_outside(indices, num_weights)
    if index is not None:
        raise ValueError(f"mncore: {op}: index {index} is not a row of a weight of {num_weights} rows; "
                         "pass the indices the forward op read")


def check_bags(op: str, grad: torch.Tensor, indices: torch.Tensor, offset2bag: torch.Tensor,
               bag_size: torch.Tensor, mode: int) -> None:
    """Embedding-bag backward: ``offset2bag`` (empty when the forward took its fast path and the backward
    rebuilds it) names a bag, a row of ``grad``, for each index; the mean divides by each bag's size."""
    bags = grad.size(0) if grad.dim() else 1
    if offset2bag.numel():
        if offset2bag.numel() < indices.numel() or _first_outside(offset2bag, bags) is not None:
            raise ValueError(f"mncore: {op}: offset2bag must name one of the gradient's {bags} bags for each of the "
                             f"{indices.numel()} indices; pass the offset2bag the forward op returned")
    if mode == 1 and bag_size.numel() < bags:
        raise ValueError(f"mncore: {op}: bag_size holds {bag_size.numel()} values for {bags} bags; pass the "
                         "bag_size the forward op returned")


def _checked(op: Any, check: Callable[[str, tuple, dict], None]) -> Callable:
    """``op``'s kernel, run after ``check(name, args, kwargs)`` has refused the values it cannot take."""
    name = op._schema.name.split("::")[-1]

    def run(*args: Any, **kwargs: Any) -> Any:
        check(name, args, kwargs)
        return op(*args, **kwargs)

    run.__name__ = run.__qualname__ = f"checked_{name}"
    return run


def checked_embedding_backward(op: Any, indices_at: int, rows_at: int, bags_at: int | None = None) -> Callable:
    """``bags_at``: where a bag op's offset2bag is (bag_size follows it, and mode follows num_weights by two)."""
    def check(name: str, args: tuple, kwargs: dict) -> None:
        check_rows(name, args[indices_at], args[rows_at])
        if bags_at is not None:
            check_bags(name, args[0], args[indices_at], args[bags_at], args[bags_at + 1], args[rows_at + 2])

    return _checked(op, check)


def checked_pool_backward(op: Any, indices_at: int, dims: int) -> Callable:
    """Max-pooling backward: every index names a position in one plane of the input (its last ``dims``
    dimensions)."""
    def check(name: str, args: tuple, kwargs: dict) -> None:
        plane = math.prod(args[1].shape[-dims:])
        index = _first_outside(args[indices_at], plane)
        if index is not None:
            raise ValueError(f"mncore: {name}: index {index} is outside an input plane of {plane} positions; "
                             "pass the indices the forward op returned")

    return _checked(op, check)


def checked_roi(op: Any) -> Callable:
    """torchvision's RoI ops: each box names an image of the batch (the input's first dimension, or
    ``batch_size`` for the backward ops); C's conversion of that float to an int truncates it. The backward
    kernels take ``rois`` of any width and read a box as 5 values from its start: the image of box ``n`` is
    value ``5 * n`` (fewer than 5 columns are refused when tracing). A kernel with no output (backward: no
    gradient) to compute reads no box."""
    def check(name: str, args: tuple, kwargs: dict) -> None:
        named = named_args(op, args, kwargs)
        rois = named["rois"]
        batch = named["batch_size"] if "batch_size" in named else named["input"].shape[0]
        boxes = rois.shape[0] if rois.dim() == 2 else 0
        if not boxes or not _roi_work(name, named):
            return
        image = _first_outside(rois.reshape(-1)[:5 * boxes:5].to(torch.int64), batch)
        if image is not None:
            raise ValueError(f"mncore: {name}: a box names image {image} of a batch of {batch} (the kernel reads "
                             "each box's image index as the first of 5 values a box)")

    return _checked(op, check)


def _roi_work(name: str, named: dict) -> bool:
    """Whether an RoI kernel computes any value: the forward ops one per (box, output channel, pooled row,
    pooled column), the position-sensitive ones with ``channels / (pooled height * width)`` output channels."""
    if "grad" in named:
        return named["grad"].numel() > 0
    pooled = named["pooled_height"] * named["pooled_width"]
    channels = named["input"].shape[1] if named["input"].dim() > 1 else 0
    return (channels // pooled if name.startswith("ps_") and pooled else channels) * pooled > 0


def checked_ctc_loss(op: Any) -> Callable:
    return _checked(op, lambda name, args, kwargs: check_ctc_arguments(*args[:4]))


def checked_ctc_loss_backward(op: Any) -> Callable:
    def check(name: str, args: tuple, kwargs: dict) -> None:
        grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha = args[:7]
        check_ctc_arguments(log_probs, targets, input_lengths, target_lengths, log_alpha,
                            (("grad", grad), ("neg_log_likelihood", neg_log_likelihood)))

    return _checked(op, check)


SUBSTITUTES: dict[Any, Callable] = {
    **{op: checked_ctc_loss(op) for op in (aten._ctc_loss.default, aten._ctc_loss.Tensor)},
    **{op: checked_ctc_loss_backward(op) for op in (aten._ctc_loss_backward.default, aten._ctc_loss_backward.Tensor)},
    aten.embedding_dense_backward.default: checked_embedding_backward(aten.embedding_dense_backward.default, 1, 2),
    aten._embedding_bag_backward.default: checked_embedding_backward(aten._embedding_bag_backward.default, 1, 6, 3),
    aten._embedding_bag_dense_backward.default: checked_embedding_backward(
        aten._embedding_bag_dense_backward.default, 1, 5, 2),
    **{getattr(aten, name).default: checked_pool_backward(getattr(aten, name).default, at, dims)
       for name, at, dims in (("max_pool2d_with_indices_backward", 7, 2), ("max_pool3d_with_indices_backward", 7, 3),
                              ("adaptive_max_pool2d_backward", 2, 2), ("adaptive_max_pool3d_backward", 2, 3),
                              ("fractional_max_pool2d_backward", 4, 2), ("fractional_max_pool3d_backward", 4, 3))},
}

# Ops of libraries mncore does not import (torchvision), by schema name: wrapped when first lowered.
BY_NAME: dict[str, Callable[[Any], Callable]] = dict.fromkeys(
    [f"torchvision::{name}" for name in ("roi_align", "_roi_align_backward", "roi_pool", "_roi_pool_backward",
                                          "ps_roi_align", "_ps_roi_align_backward", "ps_roi_pool",
                                          "_ps_roi_pool_backward")], checked_roi)
