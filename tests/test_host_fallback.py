"""Ops with a data-dependent output shape on the static-shape devices (``emu2``, ``mncore2:auto``).

Reproduced first: each op listed below raised ``StaticShapeError`` on emu2/mncore2, where pfvm:cpu ran
it eagerly; ``torch.allclose`` was refused too, and ``_scaled_dot_product_flash_attention_for_cpu``
was classed as a random op without a generator (so it fell back instead of being traced). Now the
graph is cut, the op runs on the host and the program continues lazily (``trace/fallback.py``); every
result is compared with eager PyTorch on the CPU.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

import mncore
from mncore.errors import HostFallbackWarning, StaticShapeError

DEVICES = ["emu2", "mncore2:auto"]


@pytest.fixture(params=DEVICES)
def static_device(request, sim_env):
    """A static-shape device in functional mode (the numerics are computed)."""
    mncore.init(request.param, sim_mode="functional")
    mncore.metrics.reset()
    return request.param


def _inputs() -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.tensor([0.0, 1.5, -2.0, 0.0, 3.0, 1.5, 1.5, -2.0])
    a, b = torch.randn(6, 3, generator=g), torch.randn(6, 2, generator=g)
    log_probs = torch.randn(7, 2, 5, generator=g).log_softmax(2)
    return {"x": x, "a": a, "b": b, "log_probs": log_probs}


# name -> (function of the input tensors by name, the aten ops it falls back on)
CASES = {
    "nonzero": (lambda t: torch.nonzero(t["x"]), {"nonzero"}),
    "argwhere": (lambda t: torch.argwhere(t["x"].reshape(2, 4)), {"nonzero"}),
    "masked_select": (lambda t: torch.masked_select(t["x"], t["x"] > 0), {"masked_select"}),
    "boolean_mask_index": (lambda t: t["x"][t["x"] < 1], {"index.Tensor"}),
    "unique": (lambda t: torch.unique(t["x"], return_inverse=True, return_counts=True), {"_unique2"}),
    "unique_consecutive": (lambda t: torch.unique_consecutive(t["x"], return_inverse=True, return_counts=True),
                           {"unique_consecutive"}),
    "histogram": (lambda t: torch.histogram(t["x"], bins=4), {"histogram.bin_ct"}),
    "histogramdd": (lambda t: torch.histogramdd(t["a"][:, :2], bins=[3, 2]),
                    {"_histogramdd_bin_edges", "_histogramdd_from_bin_cts"}),
    "linalg_lstsq": (lambda t: torch.linalg.lstsq(t["a"], t["b"]).solution, {"linalg_lstsq"}),
    "geqrf": (lambda t: torch.geqrf(t["a"]), {"geqrf"}),
    "ctc_loss": (lambda t: F.ctc_loss(t["log_probs"], torch.tensor([[1, 2, 2], [3, 1, 4]], device=t["x"].device),
                                      torch.tensor([7, 6], device=t["x"].device),
                                      torch.tensor([3, 2], device=t["x"].device)), {"_ctc_loss.Tensor"}),
}


def _cpu(out):
    return [t.cpu() for t in tree_leaves(out)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_data_dependent_op_runs_on_the_host_and_matches_eager(static_device, case):
    fn, fallback_ops = CASES[case]
    host = _inputs()
    want = fn(host)
    # a pending input: the graph computing it is cut at the op
    lazy = {k: (v.mncore() * 1.0) for k, v in host.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        got = fn(lazy)
    assert all(t.device.type == "mncore" for t in tree_leaves(got))
    torch.testing.assert_close(_cpu(got), _cpu(want))
    counted = mncore.metrics.fallback_ops()
    assert set(counted) == fallback_ops, counted
    assert mncore.metrics.counters()["fallback_ops"] == sum(counted.values())


def test_results_continue_lazily_into_later_graphs(static_device):
    x = torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.0, -0.5]])
    w = torch.randn(3, 4)
    want = (x[x > 0].sum() * w).relu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        picked = x.mncore()[x.mncore() > 0]
    compiles = mncore.metrics.counters()["compiles"]
    got = (picked.sum() * w.mncore()).relu()
    mncore.sync()
    assert mncore.metrics.counters()["compiles"] == compiles + 1  # the rest runs as a device graph
    torch.testing.assert_close(got.cpu(), want)


def test_backward_through_a_fallback_op_matches_eager(static_device):
    x = torch.tensor([0.5, -1.0, 2.0, 3.0, -0.5], requires_grad=True)
    (torch.masked_select(x, x > 0) ** 2).sum().backward()
    lx = x.detach().mncore().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        (torch.masked_select(lx, lx > 0) ** 2).sum().backward()
    torch.testing.assert_close(lx.grad.cpu(), x.grad)


def _nonzero_at_one_site(x):
    return torch.nonzero(x)


def test_warning_names_op_and_user_line_once_per_site(static_device):
    x = torch.tensor([0.0, 1.0, 2.0]).mncore()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            _nonzero_at_one_site(x)
        torch.nonzero(x)  # another call site warns again
    ours = [w for w in seen if issubclass(w.category, HostFallbackWarning)]
    assert len(ours) == 2, [str(w.message) for w in ours]
    assert ours[0].filename == __file__
    assert ours[0].lineno == _nonzero_at_one_site.__code__.co_firstlineno + 1
    assert "nonzero" in str(ours[0].message) and static_device.split(":")[0] in str(ours[0].message)
    assert mncore.metrics.fallback_ops() == {"nonzero": 4}


def test_fallback_error_option_refuses_with_the_op_and_site(static_device):
    mncore.init(static_device, fallback="error")
    x = torch.tensor([0.0, 1.0, 2.0]).mncore()
    with pytest.raises(StaticShapeError, match=r"nonzero at .*test_host_fallback.py:\d+ .*static-shape") as e:
        torch.nonzero(x)
    assert "fallback='warn'" in str(e.value)
    assert mncore.metrics.fallback_ops() == {}


def test_fallback_mode_from_the_environment(sim_env):
    sim_env.setenv("MNCORE_FALLBACK", "error")
    mncore.init("emu2")
    with pytest.raises(StaticShapeError, match="MNCORE_FALLBACK=error"):
        torch.unique(torch.tensor([1.0, 1.0, 2.0]).mncore())
    sim_env.setenv("MNCORE_FALLBACK", "silent")
    mncore.init("emu2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)
        got = torch.unique(torch.tensor([1.0, 1.0, 2.0]).mncore())
    torch.testing.assert_close(got.cpu(), torch.tensor([1.0, 2.0]))
    sim_env.setenv("MNCORE_FALLBACK", "sometimes")
    with pytest.raises(mncore.errors.ConfigError, match="MNCORE_FALLBACK must be one of warn, error, silent"):
        mncore.init("emu2")
    sim_env.delenv("MNCORE_FALLBACK")


def test_pfvm_still_runs_them_eagerly_without_a_warning():
    x = torch.tensor([0.0, 1.0, 2.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)
        got = torch.nonzero(x.mncore())
    torch.testing.assert_close(got.cpu(), torch.nonzero(x))


def test_sparse_results_are_refused_clearly(static_device):
    with pytest.raises(mncore.errors.LayoutError, match=r"strided \(dense\) tensors.*layout torch\.sparse_coo.*to_dense"):
        torch.tensor([0.0, 1.0]).mncore().to_sparse()


@pytest.mark.parametrize("other, want", [(1e-9, True), (1e-3, False)])
def test_allclose_is_a_host_read_returning_a_bool(static_device, other, want):
    x = torch.tensor([1.0, 2.0, 3.0])
    got = torch.allclose(x.mncore() * 2, (x + other).mncore() * 2)
    assert got is want is torch.allclose(x * 2, (x + other) * 2)
    assert mncore.metrics.fallback_ops() == {}  # a host read, not a fallback


def test_flash_attention_for_cpu_is_traced_not_classed_random(static_device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    want = op(q, k, v, 0.0, is_causal=True)
    got = op(q.mncore(), k.mncore(), v.mncore(), 0.0, is_causal=True)
    torch.testing.assert_close([t.cpu() for t in got], list(want))
    assert mncore.metrics.fallback_ops() == {}


def test_backward_op_without_a_meta_kernel_runs_on_the_host(static_device):
    """multi_margin_loss's backward has no meta kernel: it falls back from autograd's engine thread."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2), requires_grad=True)
    target = torch.tensor([1, 0, 4])
    torch.nn.MultiMarginLoss()(x, target).backward()
    lx = x.detach().mncore().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostFallbackWarning)
        torch.nn.MultiMarginLoss()(lx, target.mncore()).backward()
    torch.testing.assert_close(lx.grad.cpu(), x.grad)
    assert "multi_margin_loss_backward" in mncore.metrics.fallback_ops()
