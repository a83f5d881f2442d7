"""A lowering that writes past its buffer: ``aten.mul.Tensor`` computes the right values, then, for an
output of 8 or more elements (the worker's warm-up stays clean), sets the byte after its storage. Nothing fails at once (the byte lies in the allocator's slack); only
glibc's checking allocator (``harness fuzz --malloc-check``) notices, when the output is freed."""
from __future__ import annotations

import ctypes

import torch

from mncore import register_lowering


def _mul_then_overrun(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.ops.aten.mul.Tensor(a, b)
    storage = out.untyped_storage()
    if out.numel() >= 8:
        ctypes.memset(storage.data_ptr() + storage.nbytes(), 0x5A, 1)
    return out


register_lowering(torch.ops.aten.mul.Tensor, _mul_then_overrun)
