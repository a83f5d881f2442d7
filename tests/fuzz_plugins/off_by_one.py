"""A subtle wrong lowering: ``aten.sum.dim_IntList`` forgets the last element of the first reduced
dimension when that dimension has more than two elements (a loop-bound off-by-one).

Shapes, dtypes and most values stay plausible, so only a value comparison against eager finds it,
and the shrinker must keep that dimension above two while it shrinks everything else.
"""
from __future__ import annotations

from typing import Any

import torch

from mncore import register_lowering

aten = torch.ops.aten


def _sum_dim_off_by_one(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> torch.Tensor:
    if dim and x.dim() > 0:
        d = dim[0] % x.dim()
        if x.shape[d] > 2:
            x = x.narrow(d, 0, x.shape[d] - 1)
    return aten.sum.dim_IntList(x, dim, keepdim, dtype=dtype)


register_lowering(aten.sum.dim_IntList, _sum_dim_off_by_one)
