"""``torch.autocast('mncore', dtype=torch.bfloat16 | torch.float16)`` against eager CPU autocast.

Reference: the same module under ``torch.autocast('cpu', dtype=...)``. Both cast matmul, conv, linear
and attention down; mncore follows CUDA's lists for the rest (softmax, norms and losses in float32),
where CPU autocast leaves softmax in the lower dtype. Tolerance 1e-2
(relative and absolute) on 16-bit results: both sides run 16-bit kernels with float32 accumulation,
so outputs may differ by a couple of 16-bit ulps (bfloat16's is 2^-8 ~ 0.4 %) where summation order
differs; on emu2/mncore2 float16 operands also lose their last mantissa bit (MN-Core half is 1-6-9).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import mncore
from mncore.cache import memory as compile_cache

DTYPES = [torch.bfloat16, torch.float16]
TOL = dict(rtol=1e-2, atol=1e-2)


class Block(torch.nn.Module):
    """Conv + batch norm, attention (sdpa and an explicit softmax), layer norm and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.qkv = torch.nn.Linear(8, 24)
        self.norm = torch.nn.LayerNorm(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.bn(self.conv(x)).relu().flatten(2).transpose(1, 2)  # (B, 16 tokens, 8)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        att = F.scaled_dot_product_attention(q, k, v)
        scores = (q @ k.transpose(-1, -2) / 8 ** 0.5).softmax(-1)
        h = self.norm(att + scores @ v)
        return self.head(h.mean(1)), scores


def _inputs() -> tuple[Block, torch.Tensor]:
    torch.manual_seed(0)
    return Block().eval(), torch.randn(2, 3, 4, 4)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", ["pfvm:cpu", "emu2", "mncore2:auto"])
def test_autocast_forward_matches_cpu_autocast(sim_env, device, dtype):
    model, x = _inputs()
    with torch.autocast("cpu", dtype=dtype):
        want = model(x)
    mncore.init(device)
    lazy = copy.deepcopy(model).to("mncore")
    with torch.autocast("mncore", dtype=dtype):
        got = lazy(x.mncore())
    # mncore casts as CUDA's autocast does: softmax runs in float32 (CPU autocast leaves it in `dtype`)
    assert [g.dtype for g in got] == [dtype, torch.float32] and [w.dtype for w in want] == [dtype, dtype]
    torch.testing.assert_close(got[0].cpu(), want[0], **TOL)
    torch.testing.assert_close(got[1].cpu(), want[1].float(), **TOL)


def test_autocast_disabled_inside_matches_cpu():
    """timm's EfficientViT turns autocast off around an attention block with the tensor's device type."""
    def attend(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x @ w
        with torch.autocast(device_type=h.device.type, enabled=False):
            h = h.float()
            return (h @ h.transpose(-1, -2)).softmax(-1) @ h

    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = attend(x, w)
    with torch.autocast("mncore", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("mncore") and torch.get_autocast_dtype("mncore") == torch.bfloat16
        got = attend(x.mncore(), w.mncore())
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, **TOL)


def _train(device: str, steps: int, init_scale: float) -> tuple[list[torch.Tensor], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    batches = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(steps)]
    kind = "mncore" if device == "mncore" else "cpu"
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(kind, init_scale=init_scale)
    scales = []
    for x, y in batches:
        opt.zero_grad()
        with torch.autocast(kind, dtype=torch.float16):
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if device == "mncore":
            mncore.sync()
        scales.append(scaler.get_scale())
    return [p.detach().cpu() for p in model.parameters()], scales


def test_grad_scaler_training_matches_cpu():
    want, want_scales = _train("cpu", 3, init_scale=2.0 ** 10)
    got, scales = _train("mncore", 3, init_scale=2.0 ** 10)
    assert scales == want_scales  # no overflow: the scale stays (growth needs 2000 clean steps)
    torch.testing.assert_close(got, want, **TOL)


def test_grad_scaler_skips_an_overflowing_step_like_cpu():
    """A scale of 2^40 overflows float16 gradients: the step is skipped and the scale halved."""
    before, _ = _train("cpu", 0, init_scale=1.0)
    want, want_scales = _train("cpu", 1, init_scale=2.0 ** 40)
    got, scales = _train("mncore", 1, init_scale=2.0 ** 40)
    assert scales == want_scales == [2.0 ** 39]
    torch.testing.assert_close(got, before, rtol=0, atol=0)  # the parameters were not touched
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_autocast_matmul_is_modelled_in_mncore_half(sim_env):
    """On the simulated board a 16-bit matmul runs at the half rate, as 'mixed' runs its matmuls."""
    mncore.init("emu2")
    a = torch.randn(64, 64)
    formats = {}
    for dtype in (None, torch.bfloat16):
        compile_cache.clear()
        with torch.autocast("mncore", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            (a.mncore() @ a.mncore()).cpu()
        (exe,) = compile_cache.values()
        formats[dtype] = [k.fmt for k in exe.kernels if k.kind == "complex"]
    assert formats == {None: ["float"], torch.bfloat16: ["half"]}
