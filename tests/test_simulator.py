"""The simulated MN-Core 2 devices (``emu2``, ``mncore2:auto|N``) against eager PyTorch on CPU.

Numerics: every policy of ``float_dtype`` is checked on a small MLP (3 SGD steps) and on a
conv + batch-norm model against eager float64 (the reference) and eager float32:

* ``float``  : the same float32 kernels as eager float32, so rtol 1e-5 / atol 1e-6 (summation order only).
* ``double`` : computed in float64, results handed back in float32. One step is therefore *correctly
  rounded* (within 0.5 ulp of float32 of the float64 reference), which eager float32 is not; over three
  steps its total error is below eager float32's.
* ``mixed`` / ``half``: MN-Core half is 1-6-9 (9 stored mantissa bits). Rounding to nearest gives a
  relative error of at most u = 2^-10 per rounding. First-order error analysis: a value that went
  through N roundings on its longest dependency chain (well-conditioned maths in between: linear
  layers, ReLU, softmax cross-entropy at initialisation) carries a relative error of at most N*u.
  N is read off the compiled step graph: 'mixed' rounds the two operands of every matmul/conv
  (2 per complex kernel on the longest kernel chain); 'half' rounds the upload (1) and every kernel
  output (1 per kernel on the longest chain). Bounds used:
    - loss of step i (0-based): |dL|/|L| <= (N + i) * u   (+i: the weights carried from earlier steps were
      rounded i more times in 'half'; for 'mixed' this only loosens the bound);
    - 'mixed' keeps float32 weights, so precision shows in the weight *change* dP = P3 - P0 (all
      trainable tensors concatenated): ||dP - dP_ref|| <= N * u * sum_i ||dP_i||  (each step's update
      is off by <= N*u of its own norm; the triangle inequality sums them);
    - 'half' stores weights in half (4 roundings over 3 steps, <= u each):
      ||P - P_ref|| <= 4 * u * ||P_ref|| + N * u * sum_i ||dP_i||.
  "Measurably different from float": the policy moves the result away from the 'float' policy's by at
  least u/16 (normwise) - 2^6 times float32's unit roundoff times the chain length would still be far below it.

Unit checks of ``round_to_format`` use an independent reference written with exact rational arithmetic
(``fractions.Fraction``), with the IEEE-754 conventions for a 6-bit exponent: bias 2^5 - 1 = 31, smallest
normal 2^-30, largest normal (2 - 2^-9) * 2^31.

Devices: board locks (two processes), the compile-time DRAM check, performance mode, and
the seed's example programs run unchanged in subprocesses on ``mncore2:auto``.
"""
from __future__ import annotations

import copy
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import SIM_ENV_VARS, back_to_cpu
from tests.helpers import eager_seed_mlp_train
import torch
import torch.nn.functional as F

import mncore
from mncore.compile.precision import round_to_format
from mncore.context import Context, MNDevice
from mncore.devices import board as boards
from mncore.errors import BoardLockTimeout
from mncore.errors import DeviceOutOfMemoryError
from mncore.cache import memory as compile_cache
from mncore.ir import buffers
from mncore.observe import timeline

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-6  # float32 vs float32: the same kernels, only summation order may differ
U = 2.0 ** -10  # unit roundoff of MN-Core half (9 stored mantissa bits, round to nearest)
MAN_BITS, EXP_BITS = 9, 6
BIAS = 2 ** (EXP_BITS - 1) - 1
SMALLEST_NORMAL = 2.0 ** (1 - BIAS)
LARGEST_NORMAL = (2.0 - 2.0 ** -MAN_BITS) * 2.0 ** BIAS
DEVICES = ["emu2", "mncore2:auto"]


@pytest.fixture
def sim(sim_env):
    return sim_env


def _subprocess_env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in SIM_ENV_VARS and not k.startswith("PYTEST_")}
    env.update(HF_HUB_OFFLINE="1", MNCORE_RUNTIME_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# an independent reference for rounding to MN-Core half (exact rational arithmetic)


def ref_round_half(x: torch.Tensor) -> torch.Tensor:
    """Round every value to 1-6-9 (nearest, ties to even; flush below the smallest normal; clamp)."""
    out = []
    for v in x.double().flatten().tolist():
        if math.isnan(v) or math.isinf(v) or v == 0.0:
            out.append(v)
            continue
        a = Fraction(abs(v))
        e = math.frexp(abs(v))[1] - 1  # 2^e <= |v| < 2^(e+1)
        q = a / Fraction(2) ** e * 2 ** MAN_BITS  # in [512, 1024)
        n = math.floor(q)
        rem = q - n
        if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1):
            n += 1
        r = float(Fraction(n) * Fraction(2) ** e / 2 ** MAN_BITS)
        if r < SMALLEST_NORMAL:
            r = 0.0
        r = min(r, LARGEST_NORMAL)
        out.append(math.copysign(r, v))
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape).to(x.dtype)


def test_reference_rounding_is_sane():
    """The reference itself (runs even while round_to_format is broken)."""
    assert ref_round_half(torch.tensor([1.0 + 2 ** -10])).item() == 1.0
    assert ref_round_half(torch.tensor([1.0 + 3 * 2 ** -10])).item() == 1.0 + 2 ** -8
    assert ref_round_half(torch.tensor([1.0 + 2 ** -9])).item() == 1.0 + 2 ** -9
    assert ref_round_half(torch.tensor([2.0 ** -31])).item() == 0.0
    assert ref_round_half(torch.tensor([2.0 ** 40])).item() == LARGEST_NORMAL


def _grid(n: int, seed: int) -> torch.Tensor:
    """Random exactly representable half values: (512 + k) * 2^(e - 9), both signs, normal exponents."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(0, 512, (n,), generator=g).double()
    e = torch.randint(1 - BIAS, BIAS, (n,), generator=g).double()  # BIAS excluded: room to round up
    s = torch.randint(0, 2, (n,), generator=g).double() * 2 - 1
    return s * (512 + k) * torch.exp2(e - MAN_BITS), k, e, s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_to_format_keeps_representable_values(dtype):
    v, _, _, _ = _grid(2000, 1)
    x = v.to(dtype)
    y = round_to_format(x, "half")
    assert y.dtype == dtype
    assert torch.equal(y, x)
    big = torch.tensor([LARGEST_NORMAL, -LARGEST_NORMAL, SMALLEST_NORMAL, -SMALLEST_NORMAL, 1.0, 0.0], dtype=dtype)
    assert torch.equal(round_to_format(big, "half"), big)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_to_format_rounds_to_nearest_even(dtype):
    _, k, e, s = _grid(2000, 2)
    ulp = torch.exp2(e - MAN_BITS)
    ties = s * (512 + k + 0.5) * ulp  # exactly halfway between two neighbours
    even = torch.where(k % 2 == 0, k, k + 1)
    torch.testing.assert_close(round_to_format(ties.to(dtype), "half"), (s * (512 + even) * ulp).to(dtype),
                               rtol=0, atol=0)
    below = s * (512 + k + 0.25) * ulp
    above = s * (512 + k + 0.75) * ulp
    torch.testing.assert_close(round_to_format(below.to(dtype), "half"), (s * (512 + k) * ulp).to(dtype),
                               rtol=0, atol=0)
    torch.testing.assert_close(round_to_format(above.to(dtype), "half"), (s * (512 + k + 1) * ulp).to(dtype),
                               rtol=0, atol=0)


def test_round_to_format_matches_reference_on_random_values():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3000, generator=g) * torch.exp2(torch.randint(-25, 25, (3000,), generator=g).float()))
    y = round_to_format(x, "half")
    torch.testing.assert_close(y, ref_round_half(x), rtol=0, atol=0)
    rel = ((y.double() - x.double()).abs() / x.double().abs()).max().item()
    assert rel <= U, f"relative rounding error {rel} exceeds 2^-10"


def test_round_to_format_flushes_subnormals_to_zero():
    tiny = torch.tensor([0.75 * SMALLEST_NORMAL, 2.0 ** -31, -2.0 ** -35, 1e-20, -1e-30, 1e-40, -1e-45])
    assert (tiny != 0).all()  # float32 holds them (the last two are float32 subnormals)
    y = round_to_format(tiny, "half")
    assert torch.equal(y, torch.zeros_like(y)), y
    y64 = round_to_format(tiny.double(), "half")
    assert torch.equal(y64, torch.zeros_like(y64)), y64


def test_round_to_format_clamps_to_largest_normal():
    x = torch.tensor([2.0 ** 32, 1e30, torch.finfo(torch.float32).max, -2.0 ** 33, -1e38, (2 - 2 ** -11) * 2.0 ** 31])
    expected = torch.tensor([1, 1, 1, -1, -1, 1], dtype=torch.float32) * LARGEST_NORMAL
    torch.testing.assert_close(round_to_format(x, "half"), expected, rtol=0, atol=0)


def test_round_to_format_applies_the_exponent_range_to_bfloat16():
    """bfloat16's mantissa fits half's, its exponent range does not: values still flush and clamp (the
    clamped value is then the nearest a bfloat16 holds)."""
    x = torch.tensor([2.0 ** -33, -2.0 ** -31, 2.0 ** 40, -1e20, 1.5, SMALLEST_NORMAL], dtype=torch.bfloat16)
    want = torch.tensor([0.0, 0.0, LARGEST_NORMAL, -LARGEST_NORMAL, 1.5, SMALLEST_NORMAL]).to(torch.bfloat16)
    torch.testing.assert_close(round_to_format(x, "half"), want, rtol=0, atol=0)


def test_round_to_format_keeps_nan_and_inf_and_ignores_integers():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0 + 2 ** -10])
    y = round_to_format(x, "half")
    assert torch.isnan(y[0]) and y[1] == float("inf") and y[2] == -float("inf") and y[3] == 1.0
    i = torch.arange(-5, 5)
    assert torch.equal(round_to_format(i, "half"), i)


# ---------------------------------------------------------------------------------------------
# numerics of training steps per precision policy


def _mlp_case():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return model, [(torch.randn(16, 32), torch.randint(0, 10, (16,))) for _ in range(3)]


def _convbn_case():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5))
    return model, [(torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))) for _ in range(3)]


CASES = {"mlp": _mlp_case, "convbn": _convbn_case}


def _train(model, batches, device: str, dtype: torch.dtype | None = None):
    """SGD (lr 0.1) over ``batches``; returns losses (float64), the float64 state after every step."""
    m = copy.deepcopy(model)
    if dtype is not None:
        m = m.to(dtype)
    m = m.to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    losses, states = [], []
    for x, y in batches:
        if dtype is not None:
            x = x.to(dtype)
        opt.zero_grad()
        loss = F.cross_entropy(m(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        states.append({k: v.detach().clone() for k, v in m.state_dict().items()})
        if device == "mncore":
            mncore.sync()
    if device == "mncore":
        mncore.wait_device_ops()
    return (torch.tensor([float(l.cpu()) for l in losses], dtype=torch.float64),
            [{k: v.cpu().double() for k, v in s.items()} for s in states])


@pytest.fixture(scope="module")
def references():
    """Eager float64 and float32 runs of each case (computed once)."""
    out = {}
    for name, make in CASES.items():
        model, batches = make()
        out[name] = {"model": model, "batches": batches,
                     "f64": _train(model, batches, "cpu", torch.float64),
                     "f32": _train(model, batches, "cpu")}
    return out


def _weights(model) -> list[str]:
    return [k for k, _ in model.named_parameters()]


def _cat(state: dict, keys: list[str]) -> torch.Tensor:
    return torch.cat([state[k].flatten() for k in keys])


def _run_policy(references, case: str, device: str, policy: str):
    r = references[case]
    mncore.init(device, float_dtype=policy)
    assert mncore.settings.float_dtype == policy
    compile_cache.clear()
    result = _train(r["model"], r["batches"], "mncore")
    exes = list(compile_cache.values())
    assert exes and all(e.policy == policy for e in exes)
    return result, exes


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_float_policy_matches_eager_float32(sim, references, device, case):
    (losses, states), _ = _run_policy(references, case, device, "float")
    if device == "mncore2:auto":
        assert mncore.settings.device == "mncore2:0"
    ref_losses, ref_states = references[case]["f32"]
    torch.testing.assert_close(losses, ref_losses, rtol=RTOL, atol=ATOL)
    for got, exp in zip(states, ref_states):
        assert got.keys() == exp.keys()
        for k in exp:
            torch.testing.assert_close(got[k], exp[k], rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")


def _total_error(result, ref) -> float:
    losses, states = result
    e = (losses - ref[0]).abs().sum().item()
    for got, exp in zip(states, ref[1]):
        e += sum((got[k] - exp[k]).norm().item() for k in exp if exp[k].is_floating_point())
    return e


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_double_policy_is_closer_to_float64_than_eager_float32(sim, references, device, case):
    result, _ = _run_policy(references, case, device, "double")
    r = references[case]
    e_double, e_f32 = _total_error(result, r["f64"]), _total_error(r["f32"], r["f64"])
    assert e_double < e_f32, f"double policy error {e_double:.3e} is not below eager float32's {e_f32:.3e}"


def _ulps(got: torch.Tensor, ref64: torch.Tensor) -> float:
    """Distance in float32 ulps (at the reference's magnitude) between a float32 result and float64."""
    mag = ref64.abs().float()
    ulp = (torch.nextafter(mag, torch.full_like(mag, float("inf"))) - mag).double()
    return ((got.double() - ref64).abs() / ulp).max().item()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_double_policy_one_step_is_correctly_rounded(sim, references, device, case):
    """Computed in float64 and rounded once to float32: within 0.5 ulp (+1e-3 ulp: the float64 maths of
    the reference and of the device may differ by a few float64 ulps, 2^-29 of a float32 ulp)."""
    r = references[case]
    model, batches = r["model"], r["batches"][:1]
    mncore.init(device, float_dtype="double")
    result = _train(model, batches, "mncore")
    ref = _train(model, batches, "cpu", torch.float64)
    f32 = _train(model, batches, "cpu")
    worst = max([_ulps(result[0].float(), ref[0])]
                + [_ulps(result[1][0][k].float(), ref[1][0][k]) for k in ref[1][0] if ref[1][0][k].is_floating_point()])
    assert worst <= 0.501, f"double policy result is {worst:.3f} float32 ulps from the float64 reference"
    worst_f32 = max(_ulps(f32[1][0][k].float(), ref[1][0][k]) for k in ref[1][0] if ref[1][0][k].is_floating_point())
    assert worst_f32 > 1.0, "eager float32 is also correctly rounded here: the check cannot tell the policies apart"


def _chain(exe, weight) -> int:
    """Largest sum of ``weight(kernel)`` along a dependency chain of kernels."""
    home = {n: k for k in exe.kernels for n in k.nodes}
    best: dict[int, int] = {}
    for k in exe.kernels:
        before = [best[home[a].index] for a in k.inputs if a in home]
        best[k.index] = max(before, default=0) + weight(k)
    return max(best.values())


def _roundings(exes, policy: str) -> int:
    if policy == "mixed":
        return max(_chain(e, lambda k: 2 if k.kind == "complex" else 0) for e in exes)
    return 1 + max(_chain(e, lambda k: 1) for e in exes)


@pytest.mark.parametrize("policy", ["mixed", "half"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("device", DEVICES)
def test_reduced_precision_within_bound_and_not_float(sim, references, device, case, policy):
    r = references[case]
    (losses, states), exes = _run_policy(references, case, device, policy)
    (f_losses, f_states), _ = _run_policy(references, case, device, "float")
    n = _roundings(exes, policy)
    assert 4 <= n <= 64, n
    ref_losses, ref_states = r["f64"]
    keys = _weights(r["model"])
    p0 = _cat({k: v.double() for k, v in r["model"].state_dict().items()}, keys)
    ref_p = [p0] + [_cat(s, keys) for s in ref_states]
    step_norms = sum((ref_p[i + 1] - ref_p[i]).norm().item() for i in range(len(ref_states)))
    for i in range(len(losses)):
        rel = abs(losses[i] - ref_losses[i]) / abs(ref_losses[i])
        assert rel <= (n + i) * U, f"step {i} loss relative error {rel / U:.2f} u > {(n + i)} u"
    p, pf = _cat(states[-1], keys), _cat(f_states[-1], keys)
    if policy == "mixed":
        err = ((p - p0) - (ref_p[-1] - p0)).norm().item()
        bound = n * U * step_norms
        distinct = ((p - p0) - (pf - p0)).norm().item() / (pf - p0).norm().item()
    else:
        err = (p - ref_p[-1]).norm().item()
        bound = 4 * U * ref_p[-1].norm().item() + n * U * step_norms
        distinct = (p - pf).norm().item() / pf.norm().item()
        # every float value the device returns went through a final rounding to half
        assert torch.equal(ref_round_half(losses.float()).double(), losses), "losses"
        for k, v in states[-1].items():
            if v.is_floating_point():
                assert torch.equal(ref_round_half(v.float()).double(), v), f"{k} holds values half cannot represent"
    assert err <= bound, f"{policy}: weight error {err:.3e} exceeds the bound {bound:.3e} (N={n})"
    assert distinct >= U / 16, f"{policy} differs from float by only {distinct / U:.4f} u: is it emulated?"


def test_mixed_matmul_rounds_operands_to_half_and_accumulates_in_float32(sim):
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(8, 64, generator=g), torch.randn(64, 16, generator=g)
    mncore.init("emu2", float_dtype="mixed")
    c = a.mncore() @ b.mncore()
    mncore.sync()
    c = c.cpu().double()
    at, bt = ref_round_half(a).double(), ref_round_half(b).double()
    k = a.shape[1]
    accumulate = k * 2.0 ** -24 * (at.abs() @ bt.abs())  # float32 summation of k products
    assert ((c - at @ bt).abs() <= accumulate).all(), "not the product of half-rounded operands"
    exact = a.double() @ b.double()
    bound = (2 * U + U * U) * (a.double().abs() @ b.double().abs()) + accumulate
    assert ((c - exact).abs() <= bound).all()
    # and the rounding is really applied: the error is of the order of u, not of float32's 2^-24
    assert ((c - exact).abs() / (a.double().abs() @ b.double().abs())).max().item() > U / 8


# edge operands (a row, a column) and the product the board gives in the program's dtype: bfloat16 values
# outside half's exponent range flush below 2^-30 (2^-33 * 2^33 -> 0) and clamp above its largest normal
# (2^40 * 2^-30 -> LARGEST_NORMAL * 2^-30; both were kept); float16's largest, 65504, is 65536 in half,
# which float16 cannot hold: the operand stays 65504 (it became inf)
HALF_EDGES = {
    torch.float16: ([65504.0], [0.25], 65504.0 * 0.25),
    torch.bfloat16: ([2.0 ** -33, 2.0 ** 40, 1.0], [2.0 ** 33, 2.0 ** -30, 1.0], LARGEST_NORMAL * 2.0 ** -30 + 1.0),
}


@pytest.mark.parametrize("dtype", list(HALF_EDGES))
def test_16_bit_matmul_reads_its_operands_in_half(sim, dtype):
    """Under the 'float' policy a matmul of 16-bit tensors reads its operands in half and accumulates in
    float32. Reference: the float64 product of the operands rounded by ``ref_round_half``, rounded once to
    ``dtype``; at the edges of the formats, the products above."""
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(8, 32, generator=g).to(dtype), torch.randn(32, 4, generator=g).to(dtype)
    row, col, product = HALF_EDGES[dtype]
    ea, eb = torch.tensor([row], dtype=dtype), torch.tensor(col, dtype=dtype)[:, None]
    mncore.init("emu2")
    c, edge = (a.mncore() @ b.mncore()).cpu(), (ea.mncore() @ eb.mncore()).cpu()
    assert (c.dtype, edge.dtype) == (dtype, dtype)
    torch.testing.assert_close(c, (ref_round_half(a.double()) @ ref_round_half(b.double())).to(dtype))
    # exact: the edge products are powers of two times representable values, summed without rounding
    torch.testing.assert_close(edge, torch.tensor([[product]], dtype=torch.float64).to(dtype), rtol=0, atol=0)


def test_half_elementwise_kernel_rounds_inputs_and_output_only(sim):
    """Values inside one fused kernel stay float32; the input upload and the kernel output are rounded."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1000, generator=g)
    mncore.init("emu2", float_dtype="half")
    compile_cache.clear()
    y = x.mncore() * 3 + 1
    mncore.sync()
    y = y.cpu()
    (exe,) = compile_cache.values()
    assert len(exe.kernels) == 1, [k.describe() for k in exe.kernels]
    expected = ref_round_half(ref_round_half(x) * 3 + 1)  # float32 arithmetic in between
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# board locks


_LOCK_PROGRAM = r"""
import json, os, time
import mncore
from mncore.errors import BoardLockTimeout
out = {}
t0 = time.monotonic()
try:
    mncore.init("mncore2:auto")
    out["one_board"] = {"device": mncore.settings.device}
except BoardLockTimeout as e:
    out["one_board"] = {"error": type(e).__name__, "message": str(e), "waited": time.monotonic() - t0}
os.environ["MNCORE_SIM_BOARDS"] = "2"
mncore.init("mncore2:auto")
out["two_boards"] = {"device": mncore.settings.device}
print(json.dumps(out))
"""


def test_second_process_times_out_naming_board_and_holder_and_auto_picks_free_board(sim, tmp_path):
    """This process holds mncore2:0; another process with 1 board times out, with 2 boards gets mncore2:1."""
    mncore.init("mncore2:auto")
    assert mncore.settings.device == "mncore2:0"
    assert boards.holder(0) == str(os.getpid())
    env = _subprocess_env(tmp_path / "runtime", MNCORE_SIM_BOARDS="1", MNCORE_LOCK_TIMEOUT="1")
    p = subprocess.run([sys.executable, "-c", _LOCK_PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    one = out["one_board"]
    assert one.get("error") == "BoardLockTimeout", one
    assert "mncore2:0" in one["message"] and str(os.getpid()) in one["message"], one["message"]
    assert "MNCORE_LOCK_TIMEOUT" in one["message"]
    assert 1.0 <= one["waited"] < 30, one["waited"]
    assert out["two_boards"] == {"device": "mncore2:1"}
    assert mncore.settings.device == "mncore2:0" and boards.holder(0) == str(os.getpid())


@pytest.fixture
def board0_taken(sim):
    """Board 0 locked by someone else (another lock on its file), 2 boards, 0.2 s lock timeout."""
    sim.setenv("MNCORE_SIM_BOARDS", "2")
    sim.setenv("MNCORE_LOCK_TIMEOUT", "0.2")
    other = boards.acquire("0")
    yield other
    back_to_cpu()
    other.release()


def test_auto_skips_a_busy_board(board0_taken):
    mncore.init("mncore2:auto")
    assert mncore.settings.device == "mncore2:1"
    with pytest.raises(BoardLockTimeout, match=r"mncore2:0 by process " + str(os.getpid())):
        mncore.init("mncore2:0")


def test_failed_switch_keeps_the_board_it_had(board0_taken):
    mncore.init("mncore2:auto")
    assert mncore.settings.device == "mncore2:1"
    with pytest.raises(BoardLockTimeout):
        mncore.init("mncore2:0")
    assert mncore.settings.device == "mncore2:1"
    intruder = boards._try(1, 0)  # what another process would get
    if intruder is not None:
        intruder.release()
    assert intruder is None, "mncore2:1 is still the current device but no longer locked"


def test_board_is_released_when_switching_away(sim):
    mncore.init("mncore2:auto")
    assert mncore.settings.device == "mncore2:0"
    sim.setenv("MNCORE_LOCK_TIMEOUT", "0")
    with pytest.raises(BoardLockTimeout):
        boards.acquire("0")  # another lock on the same file: busy while we hold it
    mncore.init("emu2")
    b = boards.acquire("0")
    try:
        assert b.name == "mncore2:0" and boards.holder(0) == str(os.getpid())
    finally:
        b.release()


def test_board_index_out_of_range(sim):
    sim.setenv("MNCORE_SIM_BOARDS", "2")
    with pytest.raises(ValueError, match=r"mncore2:1"):
        mncore.init("mncore2:2")


# ---------------------------------------------------------------------------------------------
# DRAM, static shapes, sim modes


def _small_dram(sim, own: int, free: int) -> None:
    """Size the board so that ``free`` bytes remain beside what other live device tensors hold."""
    mncore.wait_device_ops()
    gc.collect()
    sim.setenv("MNCORE_SIM_DRAM_BYTES", str(buffers.live_bytes() - own + free))


def test_compile_time_out_of_memory_names_graph_needed_and_free(sim):
    mncore.init("emu2")
    a = torch.randn(64, 64)
    la = a.mncore()
    _small_dram(sim, own=a.numel() * 4, free=20000)
    y = la @ la
    with pytest.raises(DeviceOutOfMemoryError) as e:
        mncore.sync()
    msg = str(e.value)
    m = re.search(r"graph (graph_[0-9a-f]+) needs ([\d,]+) bytes.*?has ([\d,]+) bytes free", msg)
    assert m, msg
    name, need, free = m.group(1), int(m.group(2).replace(",", "")), int(m.group(3).replace(",", ""))
    assert free == 20000 and need > free
    assert need >= 2 * 64 * 64 * 4  # input and output are both resident
    # the same graph with room: its plan's peak is the figure the error named
    sim.delenv("MNCORE_SIM_DRAM_BYTES")
    compile_cache.clear()
    del y, e  # y stays pending after the failed sync (the traceback holds it too); drop it so the
    gc.collect()  # next graph is the same one
    z = la @ la
    mncore.sync()
    torch.testing.assert_close(z.cpu(), a @ a, rtol=RTOL, atol=ATOL)
    exe = next(e for e in compile_cache.values() if e.name == name)
    assert exe.plan.peak_bytes == need


def test_tensor_pending_at_out_of_memory_is_usable_afterwards(sim):
    mncore.init("emu2")
    compile_cache.clear()  # the plan is checked when a graph is compiled, not when it is reused
    a = torch.randn(64, 64)
    la = a.mncore()
    _small_dram(sim, own=a.numel() * 4, free=20000)
    y = la @ la
    with pytest.raises(DeviceOutOfMemoryError):
        mncore.sync()
    sim.delenv("MNCORE_SIM_DRAM_BYTES")
    try:
        value = y.cpu()
    except (DeviceOutOfMemoryError, mncore.DeviceExecutionError):
        return  # a clear error naming the failure is acceptable too
    torch.testing.assert_close(value, a @ a, rtol=RTOL, atol=ATOL)


def test_dram_size_override_is_validated(sim):
    sim.setenv("MNCORE_SIM_DRAM_BYTES", "lots")
    mncore.init("emu2")
    with pytest.raises(ValueError, match="MNCORE_SIM_DRAM_BYTES"):
        torch.ones(4).mncore()  # the first copy to the board needs the DRAM size
    sim.delenv("MNCORE_SIM_DRAM_BYTES")


def test_functional_mode_records_modelled_time(sim):
    mncore.init("mncore2:auto")
    compile_cache.clear()
    mncore.metrics.reset()
    timeline.clear()
    a = torch.randn(32, 32)
    out = (a.mncore() @ a.mncore()).relu()
    mncore.sync()
    mncore.wait_device_ops()
    torch.testing.assert_close(out.cpu(), (a @ a).relu(), rtol=RTOL, atol=ATOL)
    (exe,) = compile_cache.values()
    c = mncore.metrics.counters()
    assert c["modelled_device_s"] >= exe.modelled_s > 0
    device = [ev for ev in timeline.events() if ev[0] == "device"]
    assert device and all(ev[4]["time"] == "modelled" for ev in device)
    assert all(ev[3] - ev[2] == pytest.approx(ev[4]["modelled_s"]) for ev in device)
    assert [ev for ev in timeline.events() if ev[0] == "emulator"], "the host emulation has its own lane"


def test_performance_mode_waits_for_the_modelled_time(sim):
    mncore.init("mncore2:auto", sim_mode="performance")
    assert mncore.settings.sim_mode == "performance"
    compile_cache.clear()
    mncore.metrics.reset()
    timeline.clear()
    n = 8192  # 4 chained 8192^3 matmuls: ~0.18 s modelled; values are skipped, so nothing is computed
    t0 = time.perf_counter()
    a = torch.ones(n, n, device="mncore")
    for _ in range(4):
        a = a @ a
    mncore.sync()
    mncore.wait_device_ops()
    wall = time.perf_counter() - t0
    (exe,) = compile_cache.values()
    modelled = mncore.metrics.counters()["modelled_device_s"]
    assert modelled == pytest.approx(exe.modelled_s) and modelled > 0.05
    assert wall >= modelled, f"step took {wall:.3f} s, less than its modelled {modelled:.3f} s"
    device = [ev for ev in timeline.events() if ev[0] == "device"]
    assert len(device) == 1 and device[0][4]["time"] == "modelled"
    assert device[0][3] - device[0][2] == pytest.approx(modelled)  # the modelled span, on the host clock
    assert a.shape == (n, n)
    del a


def test_performance_mode_counts_every_live_output_of_a_graph_run_again(sim):
    """Performance mode hands every run of one graph the same uninitialised buffers; the device-memory
    accounting must still count each live output once, as a board holding them would."""
    mncore.init("mncore2:auto", sim_mode="performance")
    x = torch.ones(256, 256).to("mncore")
    gc.collect()  # earlier tests' garbage (cycles holding device tensors) is not freed inside the window
    base = buffers.live_bytes()
    outs = []
    for _ in range(3):
        outs.append(x * 2.0 + 1.0)
        mncore.sync()
    mncore.wait_device_ops()
    assert buffers.live_bytes() - base == 3 * 256 * 256 * 4
    assert all(o.shape == (256, 256) and o.dtype == torch.float32 for o in outs)
    del outs
    assert buffers.live_bytes() == base


@pytest.mark.parametrize("execution", ["async", "sync"])
def test_performance_mode_runs_jobs_in_the_modelled_queue_without_the_worker(sim, execution):
    """A performance-mode job computes nothing, so the executor schedules it on the submitting thread: no
    worker span, no hand-off. The queue stays the board's: jobs run in order, each for its modelled time,
    and a reader is held until the end of the job it reads (async mode returns from ``sync()`` at once)."""
    mncore.init("mncore2:auto", sim_mode="performance", execution=execution)
    n = 2048  # ~5 ms modelled per matmul: long against the host's work per sync
    a = torch.ones(n, n, device="mncore")
    a = a @ a
    mncore.sync()
    mncore.wait_device_ops()
    mncore.metrics.reset()
    timeline.clear()
    returns = []
    for _ in range(3):
        a = a @ a
        mncore.sync()
        returns.append(time.perf_counter())
    first = a.cpu()  # waits for the last job only
    read_done = time.perf_counter()
    mncore.wait_device_ops()
    drained = time.perf_counter()
    device = sorted((ev for ev in timeline.events() if ev[0] == "device"), key=lambda ev: ev[2])
    assert [ev for ev in timeline.events() if ev[0] == "worker"] == []
    assert len(device) == 3 and all(ev[4]["time"] == "modelled" for ev in device)
    assert all(later[2] >= earlier[3] for earlier, later in zip(device, device[1:])), "in order, one at a time"
    counters = mncore.metrics.counters()
    assert counters["graphs_executed"] == 3
    assert counters["modelled_device_s"] == pytest.approx(sum(ev[3] - ev[2] for ev in device))
    if execution == "sync":
        assert all(r >= ev[3] for r, ev in zip(returns, device)), "sync mode returns after the job's end"
    else:
        assert counters["wait_s"] == 0.0, "async mode does not wait for a job"
    assert read_done >= device[-1][3] and drained >= device[-1][3]
    assert first.shape == (n, n)


def test_performance_mode_async_naive_keeps_the_worker(sim):
    """``async_naive`` shows the worker's contention with the tracing host, so its jobs still go through
    the worker in performance mode (the other modes schedule them on the submitting thread)."""
    mncore.init("mncore2:auto", sim_mode="performance", execution="async_naive")
    a = torch.ones(256, 256, device="mncore")
    timeline.clear()
    b = a @ a
    mncore.sync()
    mncore.wait_device_ops()
    assert [ev for ev in timeline.events() if ev[0] == "worker"], "the worker prepared the job"
    assert [ev[4]["time"] for ev in timeline.events() if ev[0] == "device"] == ["modelled"]
    assert b.shape == (256, 256)


# ---------------------------------------------------------------------------------------------
# the seed's programs, unchanged but for the device


def _eager_lazy_mlp(steps: int = 20, w: int = 512) -> list[float]:
    torch.manual_seed(0)
    layers: list = []
    for _ in range(4):
        layers += [torch.nn.Linear(w, w), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(w, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [{"x": torch.randn(64, w), "y": torch.randint(0, 10, (64,))} for _ in range(steps)]
    losses = []
    for batch in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _run_example(tmp_path: Path, rel: str, old: str, new: str) -> tuple[int, str, str]:
    """Run a seed program with one text substitution (the device), with its own board directory."""
    src = (ROOT / rel).read_text()
    assert src.count(old) == 1, f"{rel}: expected one {old!r} to replace"
    path = tmp_path / Path(rel).name
    path.write_text(src.replace(old, new))
    p = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=_subprocess_env(tmp_path / "runtime"),
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_example_lazy_mlp_runs_on_mncore2_and_matches_eager(tmp_path):
    rc, stdout, stderr = _run_example(tmp_path, "examples/lazy_mlp.py", "torch_mncore.init(args.device)",
                                      "torch_mncore.init_mncore()")
    assert rc == 0, stderr
    losses = [float(v) for v in re.findall(r"^step\s+\d+\s+loss (\S+)$", stdout, re.M)]
    assert len(losses) == 20, stdout
    # printed with 4 decimals (+-5e-5) after float32 training that matches eager to ~1e-6
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_eager_lazy_mlp()), rtol=0, atol=1e-4)
    compiles = int(re.search(r"^\s+compiles\s+(\d+)$", stdout, re.M).group(1))
    modelled = float(re.search(r"^\s+modelled_device_s\s+(\S+) ms$", stdout, re.M).group(1))
    assert 1 <= compiles <= 2 and modelled > 0, stdout


def test_example_add_runs_on_mncore2(tmp_path):
    rc, stdout, stderr = _run_example(tmp_path, "examples/context/add.py", 'MNDevice("pfvm:cpu")',
                                      'MNDevice("mncore2:auto")')
    assert rc == 0, stderr
    body = stdout.split("result_on_cpu=tensor(", 1)[1]
    assert [float(v) for v in re.findall(r"-?\d+\.\d*", body)] == [2.0] * 12, stdout


def test_example_mlp_train_runs_on_mncore2_and_matches_eager(tmp_path):
    rc, stdout, stderr = _run_example(tmp_path, "examples/context/mlp_train.py", 'MNDevice("pfvm:cpu")',
                                      'MNDevice("mncore2:auto")')
    assert rc == 0, stderr
    loss = float(re.search(r"^last loss (\S+)$", stdout, re.M).group(1))
    body = stdout.split("Parameter containing:", 1)[1]
    bias = torch.tensor([float(v) for v in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", body)])
    eager_loss, eager_bias = eager_seed_mlp_train()
    assert loss == pytest.approx(eager_loss, rel=1e-5)
    # the bias is printed with 4 decimals
    torch.testing.assert_close(bias, eager_bias, rtol=0, atol=1e-4 + 1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_double_policy_keeps_float64_between_steps(sim, references, case):
    """Device-resident values stay float64 between graphs: after every step the parameters, read back
    once, are still the float64 result rounded once (0.5 ulp + 1e-3 ulp slack, as above)."""
    r = references[case]
    model, batches = r["model"], r["batches"]
    assert len(batches) > 1
    mncore.init("emu2", float_dtype="double")
    result = _train(model, batches, "mncore")
    ref = _train(model, batches, "cpu", torch.float64)
    worst = max(_ulps(result[1][-1][k].float(), ref[1][-1][k]) for k in ref[1][-1] if ref[1][-1][k].is_floating_point())
    assert worst <= 0.501, f"after {len(batches)} steps the double policy is {worst:.3f} float32 ulps off"


def test_context_switch_keeps_the_simulation_settings(sim):
    """Found by the report runner: switching to a Context on 'mncore2:auto' while this process already
    holds a board must keep the board, the sim mode and the precision policy chosen with init."""
    mncore.init("mncore2:auto", sim_mode="performance", float_dtype="mixed")
    Context.switch_context(Context(MNDevice("mncore2:auto")))
    assert (mncore.settings.device, mncore.settings.sim_mode, mncore.settings.float_dtype) == (
        "mncore2:0", "performance", "mixed")
    Context.switch_context(Context(MNDevice("emu2")))
    assert (mncore.settings.device, mncore.settings.sim_mode, mncore.settings.float_dtype) == (
        "emu2", "performance", "mixed")


def _modelled_per_step(step, batches) -> float:
    for b in batches[:2]:  # the first step also creates optimizer state
        step(b)
        mncore.sync()
    mncore.wait_device_ops()
    before = mncore.metrics.counters()["modelled_device_s"]
    for b in batches[2:]:
        step(b)
        mncore.sync()
    mncore.wait_device_ops()
    return (mncore.metrics.counters()["modelled_device_s"] - before) / (len(batches) - 2)


def test_lazy_step_costs_the_context_steps_device_time_with_or_without_its_gradients(sim):
    """A lazy MLP step is modelled at the Context step's device time whether it keeps its ``.grad``
    tensors live after ``sync()`` or sets them to None before the cut (``zero_grad(set_to_none=True)``
    after ``optimizer.step()``): a gradient is written to DRAM once in both APIs, by its matmul, for
    the optimizer's kernel to read; keeping it adds an output, not a write (the compiler once counted
    ``mm`` and the ``t(t(mm))`` the optimizer reads as two writes). Its parameters still match eager
    training."""
    import model_zoo
    from harness.runner import context_step

    mncore.init("mncore2:auto", sim_mode="performance")
    spec = model_zoo.get("mlp_w256")
    batches = [spec.make_batch("default", seed=s) for s in range(5)]

    def lazy(drop_grads: bool) -> float:
        model = spec.build("default", seed=0).to("mncore")
        opt = spec.optimizer(model.parameters())

        def step(b: dict) -> None:
            if not drop_grads:
                opt.zero_grad()
            spec.loss(model, model_zoo.batch_to(b, "mncore")).backward()
            opt.step()
            if drop_grads:
                opt.zero_grad(set_to_none=True)
        return _modelled_per_step(step, batches)

    ctx, step_fn = context_step(spec, spec.build("default", seed=0), MNDevice("mncore2:auto"))
    with tempfile.TemporaryDirectory() as tmp:
        compiled = ctx.compile(step_fn, batches[0], Path(tmp) / "step")
    context = _modelled_per_step(compiled, batches)
    ctx.release(write_back=False)
    kept, dropped = lazy(False), lazy(True)
    assert dropped == pytest.approx(context, rel=1e-9)
    assert kept == pytest.approx(context, rel=1e-9)

    mncore.init("mncore2:auto", sim_mode="functional", float_dtype="double")
    model = spec.build("default", seed=0)
    ref = copy.deepcopy(model).double()
    model = model.to("mncore")
    opt, ref_opt = spec.optimizer(model.parameters()), spec.optimizer(ref.parameters())
    for b in batches:
        spec.loss(model, model_zoo.batch_to(b, "mncore")).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mncore.sync()
        spec.loss(ref, {k: v.double() if v.is_floating_point() else v for k, v in b.items()}).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad is None
        # the device computes in float64; the host reads back the program's float32 (rounding: ~6e-8)
        torch.testing.assert_close(p.detach().cpu().double(), q.detach(), rtol=2e-7, atol=1e-8)


def test_a_read_of_a_result_sees_its_graph_in_the_metrics(sim, monkeypatch):
    """A graph the worker runs (functional mode) is counted before its outputs are released: reading a
    result and then the metrics, without ``wait_device_ops()``, shows its modelled time. The worker's
    accounting is slowed here; counted after the release, the read returned first and saw 0."""
    import importlib

    executor = importlib.import_module("mncore.execute.executor")
    record = executor._record_modelled

    def slow_record(exe, result):
        time.sleep(0.3)
        record(exe, result)

    monkeypatch.setattr(executor, "_record_modelled", slow_record)
    mncore.init("mncore2:auto", sim_mode="functional")
    mncore.metrics.reset()
    x = torch.randn(64, 64)
    y = (x.to("mncore") @ x.to("mncore")).relu()
    mncore.sync()
    torch.testing.assert_close(y.cpu(), (x @ x).relu())
    c = mncore.metrics.counters()
    assert c["graphs_executed"] == 1 and c["modelled_device_s"] > 0, c
