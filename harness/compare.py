"""One comparison function for every tier (op tests, model runs, fuzzing).

Default tolerances per dtype follow ``torch.testing.assert_close`` (float32 rtol 1.3e-6 / atol
1e-5, float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5, float64 1e-7 / 1e-7, integers and bools exact).
A caller may widen them only with a reason, which is kept in the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


@dataclass
class Verdict:
    ok: bool
    message: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


def tolerance(dtype: torch.dtype, scale: float = 1.0) -> tuple[float, float]:
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return rtol * scale, atol * scale


def compare(actual: Any, expected: Any, *, scale: float = 1.0, reason: str = "", meta_only: bool = False,
            path: str = "out") -> Verdict:
    """Compare nested outputs (tensors, lists, tuples, numbers); ``scale`` widens tolerances (with ``reason``)."""
    if scale != 1.0 and not reason:
        raise ValueError("widening a tolerance needs a written reason")
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return Verdict(False, f"{path}: expected a tensor, got {type(actual).__name__}")
        a, e = actual.detach().cpu(), expected.detach().cpu()
        if a.shape != e.shape or a.dtype != e.dtype:
            return Verdict(False, f"{path}: metadata differs: got {list(a.shape)} {a.dtype}, expected "
                                  f"{list(e.shape)} {e.dtype}")
        if meta_only:
            return Verdict(True, reason=reason)
        rtol, atol = tolerance(e.dtype, scale)
        if not (a.is_floating_point() or a.is_complex()):
            ok = torch.equal(a, e)
            return Verdict(ok, "" if ok else f"{path}: {int((a != e).sum())} of {a.numel()} elements differ (exact dtype)")
        native = a.dtype in (torch.float32, torch.float64, torch.complex64, torch.complex128)
        diff = (a - e).abs() if native else None
        if diff is not None and bool((diff <= (e * rtol).abs().add_(atol)).all()):
            # every element within isclose's own bound (|a - e| <= atol + |rtol * e|, the same arithmetic in
            # the same dtype) and every difference finite (isclose's other condition; NaNs failed above):
            # assert_close would pass. It runs only to judge (and word) the rest.
            max_abs = float(diff.max()) if diff.numel() else 0.0
            if max_abs != float("inf"):
                return Verdict(True, "", max_abs, 0.0, reason)
        try:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as err:
            diff = (a.double() - e.double()).abs()
            finite = torch.isfinite(diff)
            max_abs = float(diff[finite].max()) if finite.any() else float("inf")
            rel = diff / e.double().abs().clamp_min(1e-30)
            max_rel = float(rel[finite].max()) if finite.any() else float("inf")
            return Verdict(False, f"{path}: {str(err).strip()}", max_abs, max_rel, reason)
        # the agreeing case's largest difference, in the tensors' own dtype where it is float32/64 (no
        # float64 copies of both: on large outputs they cost more than the comparison itself)
        if diff is None:
            diff = (a.double() - e.double()).abs()
        return Verdict(True, "", float(diff.nan_to_num(0).max()) if diff.numel() else 0.0, 0.0, reason)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return Verdict(False, f"{path}: expected a sequence of {len(expected)}, got {type(actual).__name__}")
        worst = Verdict(True, reason=reason)
        for i, (a, e) in enumerate(zip(actual, expected)):
            v = compare(a, e, scale=scale, reason=reason, meta_only=meta_only, path=f"{path}[{i}]")
            if not v:
                return v
            worst.max_abs = max(worst.max_abs, v.max_abs)
        return worst
    if expected is None:
        return Verdict(actual is None, "" if actual is None else f"{path}: expected None")
    if isinstance(expected, float):
        ok = abs(float(actual) - expected) <= TOLERANCES[torch.float64][1] + 1e-7 * abs(expected) or actual == expected
        return Verdict(ok, "" if ok else f"{path}: {actual} != {expected}")
    ok = actual == expected
    return Verdict(ok, "" if ok else f"{path}: {actual!r} != {expected!r}")


def rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()) ** 2).mean().sqrt()) if a.numel() else 0.0


def compare_with_fp64(actual: torch.Tensor, eager: torch.Tensor, fp64: torch.Tensor, multiplier: float = 2.0,
                      floor: float = 1e-6, path: str = "out") -> Verdict:
    """Model-level check (the dynamo benchmark runner's rule): the backend's RMSE against a float64
    reference may be at most ``multiplier`` times eager float32's RMSE against it (plus ``floor``).

    Eager float32 itself drifts from float64 in badly conditioned training, so a bare allclose
    between backend and eager would flag numerical chaos as a backend bug.
    """
    if actual.shape != fp64.shape:
        return Verdict(False, f"{path}: shape {list(actual.shape)} vs reference {list(fp64.shape)}")
    err, base = rmse(actual, fp64), rmse(eager, fp64)
    ok = err <= multiplier * base + floor
    return Verdict(ok, "" if ok else f"{path}: RMSE vs float64 {err:.3g} > {multiplier} x eager float32's {base:.3g}",
                   max_abs=err)
