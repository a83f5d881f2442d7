"""A lowering that writes past its buffer: ``aten.mul.Tensor`` computes the right values, then, for an
output of 8 or more elements (the worker's warm-up stays clean), zeroes the byte after its storage. Nothing
fails at once (the byte lies in the allocator's slack); only glibc's checking allocator (``harness fuzz
--malloc-check``) notices, when the output is freed. That byte is its check byte, derived from the block's
address: where it is zero, zeroing it would go unseen, so the output is copied to another block first.
(A fixed byte used to be written, and whether glibc saw it depended on the address and the values: a
CI run found none.)"""
from __future__ import annotations

import ctypes

import torch

from mncore import register_lowering


def _end(t: torch.Tensor) -> int:
    storage = t.untyped_storage()
    return storage.data_ptr() + storage.nbytes()


def _mul_then_overrun(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.ops.aten.mul.Tensor(a, b)
    if out.numel() >= 8:
        held = []  # blocks whose check byte is zero stay allocated, so each copy lands at another address
        while ctypes.string_at(_end(out), 1) == b"\0":
            held.append(out)
            out = out.clone()
        ctypes.memset(_end(out), 0, 1)
    return out


register_lowering(torch.ops.aten.mul.Tensor, _mul_then_overrun)
