"""The precision policy (``float_dtype``) and host emulation of MN-Core 2 number formats.

Policies, for floating-point tensors (integer and bool tensors are never touched):

* ``double``: every float tensor is stored and computed in float64; results return to the host
  in the dtype the program asked for.
* ``float``: float32 storage and arithmetic (as eager PyTorch).
* ``mixed`` (the MLSDK default): tensors keep float32 storage; matmul, conv and attention
  read their operands rounded to MN-Core half (1-6-9) and accumulate in float32; normalisation,
  reductions and elementwise maths stay float32.
* ``half``: every float tensor crossing DRAM (inputs, kernel outputs) is rounded to half;
  matmul/conv/attention operands are half with float32 accumulation; values inside one fused
  kernel stay float32 (registers), as on the device.

Autocast (``torch.autocast('mncore', dtype=torch.bfloat16 | torch.float16)``) maps onto the same
formats: a matmul/conv/attention whose floating operands are all 16-bit (the autocast dtype) runs as
the device runs half matmuls under ``mixed``: operands in MN-Core half, float32 accumulation, and
the half rate in the cost model (``half_operands``). bfloat16 values are already exact in 1-6-9's
mantissa but not in its exponent range (below 2^-30 they flush, above about 4.3e9 they clamp); float16
operands lose their last mantissa bit. Operands keep their dtype, so the kernel's own dtype checks
still apply; a value the 16-bit dtype cannot hold becomes the nearest it can (float16's largest, 65504,
is 65536 in half and stays 65504).

Rounding to a format rounds the mantissa to nearest-even, flushes magnitudes below the smallest
normal to zero (no subnormals) and clamps finite values to the largest normal. NaN and Inf are
kept (the hardware has neither) so that a diverging run stays visible on the host.
"""
from __future__ import annotations

from typing import Any

import torch

from mncore.config import PRECISION_POLICIES as POLICIES
from mncore.errors import ConfigError
from mncore.ir.meta import TensorMeta
from mncore.sim.hardware import hardware

_MANTISSA_BITS = {torch.float64: 52, torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}
_EXPONENT_BITS = {torch.float64: 11, torch.float32: 8, torch.float16: 5, torch.bfloat16: 8}


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise ConfigError(f"float_dtype must be one of {', '.join(POLICIES)}; got {name!r}")
    return name


def half_operands(node: Any) -> bool:
    """The traced op ``node`` (an FX node) reads only 16-bit floating operands (autocast lowered it)."""
    metas = [(a.meta.get("mn") or [None])[0] for a in node.all_input_nodes]
    floats = [m.dtype for m in metas if m is not None and m.dtype.is_floating_point]
    return bool(floats) and all(d.itemsize == 2 for d in floats)


def kernel_format(policy: str, kind: str, half: bool = False) -> str:
    """The number format a kernel of class ``kind`` computes in under ``policy`` (for the cost model);
    ``half``: its complex ops have 16-bit operands (``half_operands``)."""
    if policy == "double":
        return "double"
    if policy == "half" or (kind == "complex" and (policy == "mixed" or half)):
        return "half"
    return "float"


def storage_bytes(meta: TensorMeta | None, policy: str) -> int:
    """Bytes a tensor occupies in device DRAM under ``policy``."""
    if meta is None:
        return 0
    shape, _, dtype = meta
    n = 1
    for s in shape:
        n *= s
    if dtype.is_floating_point:
        size = {"double": 8, "half": 2}.get(policy, 4 if dtype.itemsize >= 4 else dtype.itemsize)
    else:
        size = dtype.itemsize
    return n * size


def round_to_format(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """``x`` with its values rounded to the MN-Core format ``fmt`` (dtype unchanged)."""
    if not x.is_floating_point():
        return x
    spec = hardware().formats[fmt]
    man, exp = spec["mantissa_bits"], spec["exponent_bits"]
    if man >= _MANTISSA_BITS.get(x.dtype, 0) and exp >= _EXPONENT_BITS.get(x.dtype, 0):
        return x
    if x.dtype.itemsize == 2:  # round in float32 (the format's limits overflow 16-bit scalars); the tensor
        # keeps its dtype, which holds the nearest value it can (float16's 65504 is 65536 in half: it stays)
        limit = torch.finfo(x.dtype).max
        y = round_to_format(x.float(), fmt)
        return torch.where(torch.isfinite(y), y.clamp(-limit, limit), y).to(x.dtype)
    m, e = torch.frexp(x)
    scale = float(2 ** (man + 1))
    y = torch.ldexp(torch.round(m * scale) / scale, e)
    bias = 2 ** (exp - 1) - 1
    largest = (2.0 - 2.0 ** -man) * 2.0 ** bias
    smallest = 2.0 ** (1 - bias)
    y = torch.where(y.abs() < smallest, torch.zeros_like(y), y.clamp(-largest, largest))
    return torch.where(torch.isfinite(x), y, x)
