"""``TensorMeta``: what the tracer knows about a tensor without its values."""
from __future__ import annotations

from typing import NamedTuple

import torch


class TensorMeta(NamedTuple):
    """Shape, strides and dtype; a tuple, so it hashes and compares as one inside graph keys."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(tuple(t.shape), tuple(t.stride()), t.dtype)
