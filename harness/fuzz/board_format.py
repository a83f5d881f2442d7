"""A float64 reference that reads an op's operands as a simulated board stores them.

A simulated MN-Core 2 board (``mncore2``, ``emu2``) feeds matmul, conv and attention operands to its
matrix unit in its own half format (1-6-9: 9 mantissa bits, 6 exponent bits, no subnormals) whenever
every floating operand is 16-bit, or always under the ``mixed``/``half`` precision policies. float16
operands lose their last mantissa bit; bfloat16 operands below 2**-30 flush to zero and above half's
largest normal clamp. Eager PyTorch's
16-bit kernels do neither, so their error is no yardstick for such an op: a product whose terms cancel
differs by far more than twice eager's error, by design.

For those ops the fuzzer asks a second question: is mncore within twice eager's error of a float64 run
on the operands rounded to the board's format? The rounding, the format's widths and the list of ops the
matrix unit runs are written here independently of mncore's (bit arithmetic on float32 instead of
``frexp``/``ldexp``), so a wrong rounding in mncore is still a finding.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

import mncore

_ROUNDING_POLICIES = ("mixed", "half")
# MN-Core 2's half format (docs/simulator.md), and the ops its matrix unit runs: the fuzzer's own statement
# of them, so that mncore rounding another op, or to other widths, is still a finding
HALF = {"mantissa_bits": 9, "exponent_bits": 6}
_MATRIX_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "_convolution",
               "convolution_backward", "_grouped_mm"}


def _on_matrix_unit(op: Any) -> bool:
    name = op._schema.name.split("::")[-1]
    return name in _MATRIX_OPS or name.startswith("_scaled_dot_product_")


def operand_format(op: Any, args: list, kwargs: dict) -> dict | None:
    """The format spec the current device reads ``op``'s operands in, None where it reads them as eager."""
    settings = mncore.config.current()
    if not settings.simulated or not _on_matrix_unit(op):
        return None
    leaves = pytree.tree_leaves((args, kwargs))
    floats = [t.dtype for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floats:
        return None
    if settings.float_dtype in _ROUNDING_POLICIES or all(d.itemsize == 2 for d in floats):
        return HALF
    return None


def round_to(x: torch.Tensor, spec: dict) -> torch.Tensor:
    """``x`` (float16, bfloat16 or float32) rounded to nearest-even in ``spec``'s format, as float64.

    Subnormals flush to zero and finite values clamp to the largest normal, as the board does; NaN and
    Inf are kept (the board has neither; mncore keeps them visible, and so does this reference). mncore
    holds a 16-bit operand in its own dtype: a value that dtype cannot hold (float16's 65504 is 65536 in
    half) stays the nearest it can, here too.
    """
    man, exp = spec["mantissa_bits"], spec["exponent_bits"]
    drop = 23 - man  # float32 mantissa bits the format does not keep
    bits = x.float().view(torch.int32).long()  # int64: the rounding carry may pass bit 31
    keep = (bits >> drop) & 1
    bits = ((bits + (1 << (drop - 1)) - 1 + keep) >> drop << drop) & 0xFFFFFFFF
    y = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(torch.float32).double()
    bias = 2 ** (exp - 1) - 1
    largest = (2.0 - 2.0 ** -man) * 2.0 ** bias
    y = torch.where(y.abs() < 2.0 ** (1 - bias), torch.zeros_like(y), y.clamp(-largest, largest))
    if x.dtype.itemsize == 2:
        y = y.clamp(-torch.finfo(x.dtype).max, torch.finfo(x.dtype).max).to(x.dtype).double()
    return torch.where(torch.isfinite(x), y, x.double())


def rounded(x: Any, spec: dict, dtype: torch.dtype = torch.float64) -> Any:
    """Float tensors in ``x`` (nested lists, dicts) rounded to ``spec`` and held in ``dtype``."""
    def one(t: Any) -> Any:
        low = isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
        return round_to(t, spec).to(dtype) if low else t

    return pytree.tree_map(one, x)


def board_reference(run: Callable[[list, dict], Any], args: list, kwargs: dict, spec: dict) -> Any:
    """``run(args, kwargs)`` on the arguments rounded to ``spec``, in float64; in float32 for an op without a
    float64 kernel (``_grouped_mm``): half values are exact in float32, and its accumulation error is far
    below a 16-bit result's rounding."""
    try:
        return run(rounded(args, spec), rounded(kwargs, spec))
    except RuntimeError:
        return run(rounded(args, spec, torch.float32), rounded(kwargs, spec, torch.float32))
