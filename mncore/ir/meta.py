"""``TensorMeta``: what the tracer knows about a tensor without its values."""
from __future__ import annotations

from typing import NamedTuple

import torch


class TensorMeta(NamedTuple):
    """Shape, strides and dtype; a tuple, so it hashes and compares as one inside graph keys."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype


_tuple_new = tuple.__new__


def meta_of(t: torch.Tensor) -> TensorMeta:
    """``TensorMeta`` of ``t``, built as the tuple it is (the NamedTuple constructor is a Python call;
    this runs for every upload and every traced op's result)."""
    return _tuple_new(TensorMeta, (tuple(t.shape), tuple(t.stride()), t.dtype))
