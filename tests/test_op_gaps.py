"""Ops the OpInfo suite found missing or wrong on mncore, each against eager PyTorch on CPU: in-place
metadata ops (and what uses them: ``stft``, ``quantile``, ``nn.LSTM``), eval-mode batch-norm statistics,
tensor indices on the device, derivatives without mncore kernels, and a clear refusal of sparse layouts."""
from __future__ import annotations

import contextlib
import copy
import ctypes
import warnings
from typing import Iterator

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mncore

pytestmark = pytest.mark.unit


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same values, shape and strides (both sides run the same CPU kernels: exact up to float rounding)."""
    assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
    torch.testing.assert_close(got.cpu(), want)


METADATA_OPS = {
    "transpose_": lambda x: x.transpose_(0, 1),
    "t_": lambda x: x.t_(),
    "swapdims_": lambda x: x.swapdims_(0, 1),
    "unsqueeze_": lambda x: x.unsqueeze_(1),
    "squeeze_": lambda x: x.squeeze_(),
    "squeeze_.dim": lambda x: x.squeeze_(1),
    "as_strided_ other shape": lambda x: x.as_strided_([3], [2]),
    "resize_ same numel": lambda x: x.resize_(3, 2),
    "resize_ smaller": lambda x: x.resize_(2, 2),
    "resize_ of a transposed view": lambda x: x.t().resize_(6),
    "resize_as_": lambda x: x.resize_as_(torch.empty(6, device=x.device)),
}


@pytest.mark.parametrize("name", list(METADATA_OPS))
def test_inplace_metadata_op(name):
    f = METADATA_OPS[name]
    x = torch.randn(2, 1, 3) if name.startswith("squeeze") else torch.randn(2, 3)
    d = x.to("mncore")
    got, want = f(d), f(x)
    _same(got, want)
    if name != "resize_ of a transposed view":
        assert got is d  # the op changed the tensor itself


def test_resize_growing_keeps_the_old_values():
    x = torch.randn(2, 3)
    d = x.to("mncore").resize_(4, 5)
    assert (d.shape, d.stride()) == ((4, 5), (5, 1))
    torch.testing.assert_close(d.cpu().flatten()[:6], x.flatten())  # the rest is uninitialised in eager


def test_writes_through_an_inplace_view_reach_the_base():
    def f(x):
        v = x[1:]
        v.transpose_(0, 1).mul_(2)
        v.unsqueeze_(0)[0, 0] += 1
        return x, v

    x = torch.randn(3, 4)
    (gb, gv), (wb, wv) = f(x.to("mncore")), f(x.clone())
    _same(gb, wb)
    _same(gv, wv)


def test_gradient_through_transpose_():
    x = torch.randn(3, 4, requires_grad=True)
    d = x.detach().to("mncore").requires_grad_()
    for t in (x, d):
        y = t * 1
        y.transpose_(0, 1)
        (y.sum(0) ** 2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), x.grad)


def test_stft_and_quantile_use_inplace_metadata_ops():
    x = torch.randn(64)
    q = torch.tensor([0.1, 0.5, 0.9])
    window = torch.hann_window(16)
    want = torch.stft(x, 16, window=window, return_complex=True)
    got = torch.stft(x.to("mncore"), 16, window=window.to("mncore"), return_complex=True)
    torch.testing.assert_close(got.cpu(), want)
    y = torch.randn(5, 7)
    y[1, 2] = float("nan")
    torch.testing.assert_close(torch.quantile(y.to("mncore"), q.to("mncore"), dim=1).cpu(), torch.quantile(y, q, dim=1),
                               equal_nan=True)  # the row holding the NaN is NaN on both sides
    torch.testing.assert_close(torch.nanquantile(y.to("mncore"), q.to("mncore"), dim=0).cpu(),
                               torch.nanquantile(y, q, dim=0))


def test_lstm_batch_first_forward_and_backward():
    lstm = nn.LSTM(4, 5, num_layers=2, batch_first=True, bidirectional=True)
    x = torch.randn(3, 6, 4, requires_grad=True)
    dev_lstm = copy.deepcopy(lstm).to("mncore")
    xd = x.detach().to("mncore").requires_grad_()
    want, got = lstm(x)[0], dev_lstm(xd)[0]
    torch.testing.assert_close(got.cpu(), want)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    torch.testing.assert_close(dev_lstm.weight_hh_l1.grad.cpu(), lstm.weight_hh_l1.grad)


@pytest.mark.parametrize("op", ["native_batch_norm", "_native_batch_norm_legit"])
def test_eval_batch_norm_saves_empty_statistics(op):
    args = [torch.randn(3, 2, 4), torch.randn(2), torch.randn(2), torch.randn(2), torch.rand(2) + 0.5]
    fn = getattr(torch.ops.aten, op)
    want = fn(*args, False, 0.1, 1e-5)
    got = fn(*[a.to("mncore") for a in args], False, 0.1, 1e-5)
    for g, w in zip(got, want):
        _same(g, w)  # eager saves no statistics in eval: both are empty


def _grad_pair(f, *shape):
    """f's output and input gradient (fixed output weights) on CPU and on mncore."""
    x = torch.randn(*shape, requires_grad=True)
    d = x.detach().to("mncore").requires_grad_()
    (want,), (got,) = [torch.autograd.grad(f(t), t, torch.ones_like(f(t))) for t in (x, d)]
    return got, want


def test_sgn_backward():
    got, want = _grad_pair(lambda t: torch.sgn(t) * t, 4, 5)  # sgn's own gradient is autograd's zero tensor
    _same(got, want)


def test_tensor_split_with_device_indices():
    x = torch.randn(5, 6)
    for split in (torch.tensor([1, 4]), torch.tensor(3)):
        want = torch.tensor_split(x, split, dim=1)
        got = torch.tensor_split(x.to("mncore"), split.to("mncore"), dim=1)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)


def test_repeat_interleave_with_tensor_repeats_and_backward():
    repeats = torch.tensor([1, 0, 3])
    got, want = _grad_pair(lambda t: t.repeat_interleave(repeats.to(t.device), dim=1) * 2, 2, 3)
    _same(got, want)
    x = torch.randn(2, 3)
    _same(x.to("mncore").repeat_interleave(repeats.to("mncore"), dim=1), x.repeat_interleave(repeats, dim=1))


@pytest.mark.parametrize("fn", ["hfft", "hfft2", "hfftn"])
def test_hfft_backward_resolves_conjugate_views(fn):
    f = getattr(torch.fft, fn)
    x = torch.randn(3, 4, 5, requires_grad=True)  # a real input: its gradient passes through conj views
    d = x.detach().to("mncore").requires_grad_()
    want, got = f(x), f(d)
    torch.testing.assert_close(got.cpu(), want)
    w = torch.randn(want.shape)
    (gw,), (gg,) = torch.autograd.grad(want, x, w), torch.autograd.grad(got, d, w.to("mncore"))
    torch.testing.assert_close(gg.cpu(), gw)


@pytest.mark.parametrize("make", [lambda: torch.eye(3).to_sparse().to("mncore"),
                                  lambda: torch.eye(3).to("mncore").to_sparse(),
                                  lambda: torch.eye(3).to("mncore").to_sparse_csr()],
                         ids=["upload a COO tensor", "to_sparse", "to_sparse_csr"])
def test_sparse_layouts_refused_clearly(make):
    with pytest.raises(mncore.errors.LayoutError, match=r"layout torch\.sparse_(coo|csr).*\.to_dense\(\)"):
        make()


def test_unreduced_multilabel_margin_loss_of_a_1d_input():
    """Eager gives a 0-d loss where the meta kernel says [1]: the trace follows eager."""
    x, t = torch.randn(10), torch.tensor([3, 0, -1, 5, 0, 0, 0, 0, 0, 0])
    loss = nn.MultiLabelMarginLoss(reduction="none")
    _same(loss(x.to("mncore"), t.to("mncore")), loss(x, t))


GROUPED_MM = {  # (mat_a, mat_b, group ends, backward): each layout transformers' MoE layers and autograd use
    "2d x 3d": ((12, 8), (3, 8, 8), [3, 7, 12], True),
    # a 6-wide output: its rows are padded to 16 bytes; eager's own backward refuses a 6-wide gradient
    "2d x 3d, mat_b transposed (output padded)": ((12, 8), "t", [3, 7, 12], False),
    "2d x 2d": ((8, 12), (12, 8), [3, 7, 12], True),
    "3d x 3d": ((3, 4, 8), (3, 8, 8), None, True),
}


@pytest.mark.parametrize("layout", list(GROUPED_MM))
def test_grouped_mm_in_float32_is_traced_with_its_gradients(layout):
    """``_grouped_mm`` (Mixtral-style MoE experts) in float32: PyTorch's meta rule accepts only CUDA's 16-bit
    operands, so it ran as a host fallback after an implicit sync, and the Context API refused it. Now it is
    traced; values, padded strides and both gradients match eager's CPU kernel."""
    a_shape, b_shape, ends, backward = GROUPED_MM[layout]
    a = torch.randn(*a_shape, requires_grad=True)
    b = (torch.randn(3, 6, 8).transpose(-2, -1) if b_shape == "t" else torch.randn(*b_shape)).requires_grad_()
    offs = None if ends is None else torch.tensor(ends, dtype=torch.int32)
    want = torch.ops.aten._grouped_mm(a, b, offs)
    da, db = (t.detach().to("mncore").requires_grad_() for t in (a, b))
    before = mncore.metrics.counters().get("fallback_ops", 0)
    got = torch.ops.aten._grouped_mm(da, db, None if offs is None else offs.to("mncore"))
    assert mncore.metrics.counters().get("fallback_ops", 0) == before  # traced, not run on the host
    _same(got, want)
    if not backward:
        return
    w = torch.randn(want.shape)
    (want * w).sum().backward()
    (got * w.to("mncore")).sum().backward()
    torch.testing.assert_close(da.grad.cpu(), a.grad)
    torch.testing.assert_close(db.grad.cpu(), b.grad)


def test_grouped_mm_refuses_at_the_op_what_eager_refuses():
    """A 6-wide float32 ``mat_b`` has rows that are not 16-byte aligned: eager's kernel refuses it, and so
    does mncore, at the op (naming the operand and the fix) rather than when the graph runs."""
    a, b, offs = torch.randn(12, 8), torch.randn(3, 8, 6), torch.tensor([3, 7, 12], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        torch.ops.aten._grouped_mm(a, b, offs)
    with pytest.raises(RuntimeError, match=r"mat_b \(shape \[3, 8, 6\].*make its last dimension a multiple of 4"):
        torch.ops.aten._grouped_mm(a.to("mncore"), b.to("mncore"), offs.to("mncore"))



@pytest.mark.parametrize("empty", ["mat_b", "mat_a"])
def test_grouped_mm_with_an_empty_transposed_operand_runs_as_in_eager(empty: str, sim_env):
    """Found by fuzzing ``mncore2:auto``: an empty transposed operand passes eager's alignment check, but its
    device buffer is a dense copy whose rows of one element the kernel refused when the graph ran. mncore
    gives it strides the kernel accepts; the result has eager's shape and, where the offsets leave groups
    empty, zeros (the sum over nothing)."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 8, dtype=torch.float16).t(), torch.randn(0, 8, dtype=torch.float16).t()
    if empty == "mat_a":
        a, b = torch.randn(0, 8, dtype=torch.float16).t(), torch.randn(8, 8, dtype=torch.float16).t()
    offs = torch.tensor([0 if empty == "mat_a" else 4, 0 if empty == "mat_a" else 8], dtype=torch.int32)
    want = torch.ops.aten._grouped_mm(a, b, offs)
    mncore.init("mncore2:auto")  # its buffers are dense copies (pfvm's keep the transposed strides)
    got = torch.ops.aten._grouped_mm(a.to("mncore"), b.to("mncore"), offs.to("mncore")).cpu()
    assert got.shape == want.shape and got.dtype == want.dtype and not got.count_nonzero()

EMBEDDING_BAG = {  # (mode, per-sample weights, include_last_offset, padding_idx, dtype): each CPU kernel path
    "sum, fast path": ("sum", False, False, None, torch.float32),
    "sum, weighted, last offset": ("sum", True, True, None, torch.float32),
    "sum, padding index": ("sum", False, False, 3, torch.float32),
    "sum, float64 (no fast path)": ("sum", False, False, None, torch.float64),
    "mean, last offset": ("mean", False, True, None, torch.float32),
    "max": ("max", False, False, None, torch.float32),
    "max, last offset": ("max", False, True, 3, torch.float32),
}


@pytest.mark.parametrize("case", list(EMBEDDING_BAG))
def test_embedding_bag_outputs_and_gradients_follow_eager(case):
    """The kernel's bookkeeping outputs (offset2bag, bag sizes, max indices) have other shapes on meta
    tensors than on the CPU; the trace follows the CPU's, so they can be read, and the backward agrees."""
    mode, weighted, last, pad, dtype = EMBEDDING_BAG[case]
    torch.manual_seed(0)
    weight, idx = torch.randn(16, 5, dtype=dtype), torch.randint(0, 16, (9,))
    # an empty bag in the middle; with include_last_offset the last offset closes the indices (eager's
    # weighted backward leaves the gradient uninitialised for indices past a closing offset)
    offsets = torch.tensor([0, 4, 4, 9 if last else 7])
    scale = torch.rand(9, dtype=dtype) if weighted else None
    code = {"sum": 0, "mean": 1, "max": 2}[mode]

    def outputs(device: str) -> tuple[torch.Tensor, ...]:
        return torch.ops.aten._embedding_bag.default(
            weight.to(device), idx.to(device), offsets.to(device), False, code, False,
            None if scale is None else scale.to(device), last, -1 if pad is None else pad)

    got, want = outputs("mncore"), outputs("cpu")
    assert [o.shape for o in got] == [o.shape for o in want]
    for g, w in zip(got[:3] if mode != "max" else got, want):  # max_indices is unwritten outside max mode
        _same(g, w)

    def gradient(device: str) -> torch.Tensor:
        w = weight.clone().to(device).requires_grad_()
        out = nn.functional.embedding_bag(idx.to(device), w, offsets.to(device), mode=mode,
                                          per_sample_weights=None if scale is None else scale.to(device),
                                          include_last_offset=last, padding_idx=pad)
        (out * torch.arange(out.numel(), dtype=dtype, device=device).view_as(out)).sum().backward()
        return w.grad

    _same(gradient("mncore"), gradient("cpu"))


EMPTY_INPUT_LOSSES = {  # PyTorch's shape functions of these divide by numel or check an int as a bool
    "mse_loss": lambda x, y: nn.functional.mse_loss(x, y),
    "huber_loss": lambda x, y: nn.functional.huber_loss(x, y),
    "upsample_nearest1d": lambda x, y: torch.ops.aten.upsample_nearest1d.default(x, [4], 2.0).sum(),
}


@pytest.mark.parametrize("name", list(EMPTY_INPUT_LOSSES))
def test_ops_whose_shape_function_fails_on_empty_inputs_run_eagerly(name):
    """Found by fuzzing: on an empty input the meta kernel raised ZeroDivisionError (mse_loss_backward,
    huber_loss_backward) or TypeError (upsample_nearest1d), where eager returns a result. The op runs
    eagerly instead; forward and gradient agree with eager (NaN for a mean over nothing)."""
    fn = EMPTY_INPUT_LOSSES[name]
    x, y = torch.randn(0, 3, 2), torch.randn(0, 3, 2)
    xe = x.clone().requires_grad_()
    want = fn(xe, y)
    want.backward()
    xm = x.to("mncore").requires_grad_()
    got = fn(xm, y.to("mncore"))
    got.backward()
    mncore.sync()
    torch.testing.assert_close(got.cpu(), want.detach(), equal_nan=True)
    _same(xm.grad, xe.grad)


def test_histc_of_a_bool_tensor_is_refused_as_eager_refuses_it():
    """mncore's histc counts integers (as CUDA's kernel does; CPU's has none), but no kernel takes bool: a bool
    input raises eager's own NotImplementedError at the call instead of returning a bool histogram."""
    x = torch.tensor([True, False, True])
    with pytest.raises(NotImplementedError):
        torch.histc(x, 4, 0, 3)
    with pytest.raises(NotImplementedError):
        torch.histc(x.to("mncore"), 4, 0, 3)
    ints = torch.tensor([1, 0, 1, 3])
    got = torch.histc(ints.to("mncore"), 4, 0, 3)
    assert got.dtype == torch.int64
    assert got.cpu().tolist() == torch.histc(ints.double(), 4, 0, 3).long().tolist()


@pytest.mark.parametrize("which", ["grads", "exp_avg_sqs"])
def test_fused_adam_with_a_list_shaped_unlike_its_parameters_is_refused(which):
    """Found by fuzzing: eager's fused Adam does not check its lists, and a state tensor of another shape
    than its parameter crashed the process (eager's too); mncore refuses the step and names the tensor."""
    params = [torch.randn(4, 16).to("mncore"), torch.randn(16).to("mncore")]
    lists = {name: [torch.zeros_like(p) for p in params] for name in ("grads", "exp_avgs", "exp_avg_sqs")}
    lists[which][0] = torch.zeros(1, 16).to("mncore")
    steps = [torch.tensor(1.0).to("mncore") for _ in params]
    with pytest.raises(RuntimeError, match=rf"mncore: _fused_adam_: {which}\[0\] has shape \[1, 16\] but its parameter"):
        torch._fused_adam_(params, lists["grads"], lists["exp_avgs"], lists["exp_avg_sqs"], [], steps, lr=0.01,
                           beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)


def test_fused_adam_with_matching_lists_still_matches_eager():
    """The check lets a well-formed step through: one fused Adam step on mncore against eager's."""
    torch.manual_seed(0)
    params = [torch.randn(4, 16), torch.randn(16)]
    grads = [torch.randn_like(p) for p in params]

    def step(device: str) -> list:
        ps = [p.clone().to(device) for p in params]
        state = [[torch.zeros_like(p) for p in ps] for _ in range(2)]
        steps = [torch.tensor(1.0).to(device) for _ in ps]
        torch._fused_adam_(ps, [g.to(device) for g in grads], *state, [], steps, lr=0.01, beta1=0.9, beta2=0.999,
                           weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return [p.cpu() for p in ps]

    for got, want in zip(step("mncore"), step("cpu")):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["native_batch_norm_backward", "batch_norm_backward"])
def test_batch_norm_gradient_of_an_input_without_batch_or_channels_is_zero_not_a_crash(name: str):
    """Found by fuzzing: CPU's batch-norm backward kernels divide by the batch size and the channel count, so
    an input with no batch or no channels killed the process (SIGFPE, eager's own too), and mncore's shape
    rule divided by zero first (the op then ran on the host, where it crashed). The gradients are sums over
    nothing: an empty input gradient and zero weight and bias gradients, computed in the graph (no host
    fallback), for each output the mask asks for; an input with both still gets eager's gradients."""
    op = getattr(torch.ops.aten, name).default
    tail = [torch.empty(0, dtype=torch.uint8)] if name == "batch_norm_backward" else []
    with warnings.catch_warnings():
        warnings.simplefilter("error", mncore.HostFallbackWarning)
        for shape in [(0, 3, 2, 2), (2, 0, 2, 2), (0, 0)]:
            c = shape[1]
            x, stats = torch.randn(shape), [torch.rand(c) + 0.5 for _ in range(5)]
            for train, mask in [(True, [True] * 3), (False, [True, False, True]), (True, [False, True, False])]:
                got = op(*[t.to("mncore") for t in (x, x, *stats)], train, 1e-5, mask,
                         *[t.to("mncore") for t in tail])
                for g, asked, want in zip(got, mask, (shape, (c,), (c,))):
                    if asked:
                        assert g.shape == want and not g.cpu().count_nonzero(), (shape, train, mask)
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 3, 2, 2, dtype=torch.float64), torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64)
    mean, var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    _, save_mean, save_invstd = torch.ops.aten.native_batch_norm(x, w, b, mean, var, True, 0.1, 1e-5)
    grad = torch.randn_like(x)
    args = [grad, x, w, mean, var, save_mean, save_invstd, True, 1e-5, [True] * 3]
    want = op(*args, *tail)
    got = op(*[a.to("mncore") if isinstance(a, torch.Tensor) else a for a in args + tail])
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e)

def test_pdist_gradient_of_an_input_without_rows_is_empty_not_a_crash():
    """Found by fuzzing: CPU's ``_pdist_backward`` divides by zero on a (0, m) input and the process dies
    (SIGFPE, eager's own too), and mncore ran that kernel. The gradient of no rows is empty; an input with
    rows still gets eager's gradient, and a dtype CPU's kernel refuses is refused without rows too."""
    x = torch.randn(0, 16).to("mncore").requires_grad_()
    torch.nn.functional.pdist(x).sum().backward()
    assert x.grad.shape == (0, 16) and x.grad.cpu().abs().sum().item() == 0
    one = torch.ones(1, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        torch.ops.aten._pdist_backward.default(one, torch.ones(0, 16, dtype=torch.bfloat16), 2.0, one)
    got = torch.ops.aten._pdist_backward.default(one.mncore(), torch.ones(0, 16, dtype=torch.bfloat16).mncore(), 2.0,
                                                 one.mncore())
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match="not implemented for 'BFloat16'"):
        mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        got.cpu()
    torch.manual_seed(0)
    y = torch.randn(3, 4)
    ye, ym = y.clone().requires_grad_(), y.to("mncore").requires_grad_()
    torch.nn.functional.pdist(ye).sum().backward()
    torch.nn.functional.pdist(ym).sum().backward()
    torch.testing.assert_close(ym.grad.cpu(), ye.grad)


def test_batch_norm_with_statistics_unlike_the_channels_is_refused_not_a_crash():
    """Found by fuzzing: ``native_batch_norm`` called with a running_var of 1 value for 12 channels wrote
    12 values into it and corrupted the heap (eager's kernel too); a bias of 1 value for 48 channels read
    past it. PyTorch's ``batch_norm`` requires one value per channel; so does mncore for the ops beneath it.
    Well-formed calls, training and evaluation, forward and backward, give eager's results."""
    op = torch.ops.aten.native_batch_norm.default
    x = torch.randn(2, 12, 3)
    stats = [torch.ones(12), torch.zeros(12), torch.zeros(12), torch.ones(12)]
    for i, n in ((3, 1), (1, 2)):
        bad = [t.to("mncore") for t in stats]
        bad[i] = torch.ones(n).to("mncore")
        with pytest.raises(RuntimeError, match=f"should contain 12 elements .* not {n}"):
            op(x.to("mncore"), *bad, True, 0.1, 1e-5)
    for training in (True, False):
        ref = [t.clone() for t in stats]
        dev = [t.to("mncore") for t in stats]
        want = op(x, *ref, training, 0.1, 1e-5)
        got = op(x.to("mncore"), *dev, training, 0.1, 1e-5)
        for g, w in zip(list(got) + dev, list(want) + ref):  # outputs, then the running statistics it updates
            torch.testing.assert_close(g.cpu(), w)
    bn = nn.BatchNorm1d(12).eval()  # evaluation backward: empty saved statistics, the running ones are read
    xe, xd = x.clone().requires_grad_(), x.to("mncore").requires_grad_()
    bn(xe).pow(2).sum().backward()
    copy.deepcopy(bn).to("mncore")(xd).pow(2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xe.grad)
    # the backward kernels read grad_out as the input's values (found fuzzing: NaN from a gradient of 1 row for 4)
    _, mean, invstd = op(x, *stats, True, 0.1, 1e-5)
    with pytest.raises(RuntimeError, match="grad_out holds 12 values, but the kernel reads one per value of the input, 72"):
        torch.ops.aten.native_batch_norm_backward(*[t.to("mncore") for t in (x[:1, :, :1], x, stats[0], stats[2], stats[3],
                                                                             mean, invstd)], True, 1e-5, [True] * 3)


def test_embedding_backward_with_indices_past_the_rows_is_refused_not_a_crash():
    """Found by fuzzing: CPU's embedding backward kernels scatter into a gradient of ``num_weights`` rows by
    the indices without checking them (the forward op did), so ``_embedding_bag_backward`` called with an
    index of 15 for one row wrote past mncore's buffer and crashed the process. In-range indices give
    eager's gradient."""
    grad, indices = torch.randn(4, 3), torch.tensor([0, 2, 1, 2])
    want = torch.ops.aten.embedding_dense_backward.default(grad, indices, 3, -1, False)
    got = torch.ops.aten.embedding_dense_backward.default(grad.mncore(), indices.mncore(), 3, -1, False)
    torch.testing.assert_close(got.cpu(), want)
    bad = torch.ops.aten.embedding_dense_backward.default(grad.mncore(), (indices + 13).mncore(), 3, -1, False)
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match="index 13 is not a row of a weight of 3 rows"):
        mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        bad.cpu()
    bags = [torch.randn(2, 1), torch.tensor([15, 10, 9, 3]), torch.tensor([0, 2]), torch.tensor([0, 0, 1, 1]),
            torch.tensor([2, 2]), torch.tensor([0, 0])]
    got = torch.ops.aten._embedding_bag_backward.default(*[t.mncore() for t in bags], 16, False, 0, False, None)
    want = torch.ops.aten._embedding_bag_backward.default(*bags, 16, False, 0, False, None)
    torch.testing.assert_close(got.cpu(), want)
    bad = torch.ops.aten._embedding_bag_backward.default(*[t.mncore() for t in bags], 1, False, 0, False, None)
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match="index 15 is not a row of a weight of 1 rows"):
        mncore.wait_device_ops()
    # found next: an offset2bag naming bags the gradient does not have (it has none) read past it
    no_bags = [torch.randn(0, 16), torch.tensor([3, 5]), torch.zeros(0, dtype=torch.int64), torch.tensor([0, 1]),
               torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)]
    bad = torch.ops.aten._embedding_bag_backward.default(*[t.mncore() for t in no_bags], 16, False, 1, False, None)
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match="offset2bag must name one of the gradient's 0 bags"):
        mncore.wait_device_ops()
    weight, idx, offsets = torch.randn(16, 3), torch.tensor([3, 5, 5, 9, 0]), torch.tensor([0, 2, 2])
    for mode in ("sum", "mean", "max"):  # through autograd, with the bookkeeping the forward op returns
        we, wd = weight.clone().requires_grad_(), weight.mncore().requires_grad_()
        F.embedding_bag(idx, we, offsets, mode=mode).pow(2).sum().backward()
        F.embedding_bag(idx.mncore(), wd, offsets.mncore(), mode=mode).pow(2).sum().backward()
        torch.testing.assert_close(wd.grad.cpu(), we.grad)


@pytest.mark.parametrize("pool", ["max_pool2d", "adaptive_max_pool2d", "max_pool3d"])
def test_max_pool_backward_with_indices_outside_the_planes_is_refused_not_a_crash(pool):
    """Found by fuzzing: CPU's max-pooling backward kernels scatter the gradient into each input plane by
    ``indices`` without checking them; an index of 3 for planes of one position wrote past mncore's buffer.
    Through autograd (indices from the forward op) the gradient is eager's."""
    torch.manual_seed(0)
    dims = 3 if pool.endswith("3d") else 2
    x = torch.randn(2, 3, *[4] * dims)
    forward = {"max_pool2d": lambda t: F.max_pool2d(t, 2, return_indices=True),
               "max_pool3d": lambda t: F.max_pool3d(t, 2, return_indices=True),
               "adaptive_max_pool2d": lambda t: F.adaptive_max_pool2d(t, 3, return_indices=True)}[pool]
    xe, xd = x.clone().requires_grad_(), x.mncore().requires_grad_()
    (out_e, _), (out_d, idx) = forward(xe), forward(xd)
    out_e.pow(2).sum().backward()
    out_d.pow(2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xe.grad)
    op = getattr(torch.ops.aten, f"{pool}_with_indices_backward" if pool.startswith("max") else f"{pool}_backward")
    bad = idx.cpu().clone()
    bad.view(-1)[5] = 4 ** dims  # one past the plane
    extra = [[2] * dims, [2] * dims, [0] * dims, [1] * dims, False] if pool.startswith("max") else []
    got = op.default(out_d.detach(), xd.detach(), *extra, bad.mncore())
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match=f"index {4 ** dims} is outside an input plane of {4 ** dims}"):
        mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        got.cpu()


def test_ctc_loss_with_labels_outside_the_classes_is_refused_not_a_crash():
    """Found by fuzzing: CPU's CTC kernels index log_probs and the gradient they write by the target labels,
    and the backward op fills a tensor shaped like log_alpha, without checking either. A label past the
    classes (or a short log_alpha) read and wrote past mncore's dense device buffers and the process died
    later. mncore checks the labels each sequence uses (padding past target_lengths may hold anything)."""
    torch.manual_seed(0)
    steps, classes = 10, 5
    log_probs = torch.randn(steps, 2, classes).log_softmax(2)
    lengths = torch.tensor([steps, steps])
    padded = torch.tensor([[1, 2, -1], [3, 4, 1]])  # -1: padding past the first sequence's 2 labels
    for targets, target_lengths in ((padded, torch.tensor([2, 3])), (torch.tensor([1, 2, 3, 4, 1]), torch.tensor([2, 3]))):
        lp_e, lp_d = log_probs.clone().requires_grad_(), log_probs.to("mncore").requires_grad_()
        want = F.ctc_loss(lp_e, targets, lengths, target_lengths)
        got = F.ctc_loss(lp_d, targets.to("mncore"), lengths.to("mncore"), target_lengths.to("mncore"))
        want.backward()
        got.backward()
        torch.testing.assert_close(got.cpu(), want)
        torch.testing.assert_close(lp_d.grad.cpu(), lp_e.grad)
    bad = torch.tensor([[1, 7, 2], [3, 4, 1]])  # 7: the kind of label an off-by-one in the classes gives
    with pytest.raises(ValueError, match=r"target label 7 is not a class of log_probs, which has 5"):
        F.ctc_loss(log_probs.to("mncore"), bad.to("mncore"), lengths.to("mncore"), torch.tensor([3, 3]).to("mncore"))
    nll, alpha = torch.ops.aten._ctc_loss.Tensor(log_probs, padded, lengths, torch.tensor([2, 3]))
    short = [t.to("mncore") for t in (torch.ones(2), log_probs, padded, lengths, torch.tensor([2, 3]), nll, alpha[:, :, :4])]
    with pytest.raises(ValueError, match=r"log_alpha of shape \[2, 10, 4\] is smaller than these targets need "
                                         r"\[2, 10, 7\]"):  # no shape function: it runs eagerly, and raises at the op
        torch.ops.aten._ctc_loss_backward.Tensor(*short, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn", ["silu", "mish"])
def test_16_bit_silu_and_mish_gradients_are_as_accurate_as_eager(fn, dtype):
    """Found by fuzzing: ``silu_backward`` and ``mish_backward`` reached mncore as PyTorch's composite
    steps, each rounded to 16 bits, where the CPU kernel computes in float32 and rounds once; the
    gradient was off by up to a few hundred ulps. Judged against float64: mncore's error may be at most
    eager's own (both now run the CPU kernel), checked through autograd and on the backward op itself."""
    torch.manual_seed(0)
    x, g = (torch.randn(4096) * 3).to(dtype), torch.randn(4096).to(dtype)
    f = getattr(torch.nn.functional, fn)
    backward = getattr(torch.ops.aten, f"{fn}_backward").default

    def autograd_grad(device: str) -> torch.Tensor:
        leaf = x.clone().to(device).requires_grad_()
        f(leaf).backward(g.to(device))
        return leaf.grad.cpu()

    want = backward(g.double(), x.double())
    for got_fn in (autograd_grad, lambda d: backward(g.to(d), x.to(d)).cpu()):
        eager_err = (got_fn("cpu").double() - want).abs().max()
        mncore_err = (got_fn("mncore").double() - want).abs().max()
        assert mncore_err <= eager_err, (fn, dtype, float(mncore_err), float(eager_err))


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD", "Adagrad"])
def test_fused_optimizer_step_follows_strides_where_cpus_kernel_does_not(name):
    """Found by fuzzing: CPU's fused optimizer kernels index every tensor as if it were contiguous, so a
    transposed parameter whose ``.grad`` a user set as a contiguous tensor is updated with the wrong
    elements (eager's too; autograd's own gradients match the parameter's strides and are not affected).
    mncore runs those kernels on dense copies. Reference: the single-tensor implementation on CPU."""
    cls = getattr(torch.optim, name)
    kwargs = {"momentum": 0.9} if name == "SGD" else {}

    def steps(device: str, **impl) -> torch.Tensor:
        torch.manual_seed(0)
        w = nn.Parameter(torch.randn(3, 4).t().to(device))
        opt = cls([w], lr=0.1, **kwargs, **impl)
        for i in range(3):
            w.grad = (torch.randn(4, 3) + i).to(device)  # contiguous, unlike w
            opt.step()
        return w.detach().cpu()

    torch.testing.assert_close(steps("mncore", fused=True), steps("cpu", foreach=False))


_FUSED = {"Adam": {}, "AdamW": {}, "SGD": {"momentum": 0.9}, "Adagrad": {}}


def _fused_training(device: str, name: str, lr: float | torch.Tensor, width: int = 5) -> list[torch.Tensor]:
    """Four steps of a small MLP with ``torch.optim.<name>(fused=True)``; its parameters and optimizer state."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3)).to(device)
    opt = getattr(torch.optim, name)(model.parameters(), lr=lr, fused=True, **_FUSED[name])
    for _ in range(4):
        opt.zero_grad()
        model(torch.randn(6, 4).to(device)).square().sum().backward()
        opt.step()
        if device == "mncore":
            mncore.sync()
    return [p.detach().cpu() for p in model.parameters()] + [v.cpu() for st in opt.state.values() for v in st.values()]


@pytest.mark.parametrize("lr", ["float", "tensor"])
@pytest.mark.parametrize("name", list(_FUSED))
def test_fused_optimizer_steps_are_graph_nodes_and_match_eager(name, lr):
    """``SGD(fused=True)``, ``Adagrad(fused=True)`` and a fused step with a tensor ``lr`` ran eagerly (PyTorch has
    a shape rule for Adam and AdamW with a float ``lr`` only), cutting the graph at every optimizer step and
    keeping step capture from replaying it; mncore's own rule makes each a graph node."""
    rate = 0.1 if lr == "float" else torch.tensor(0.1)
    mncore.metrics.reset()
    got = _fused_training("mncore", name, rate)
    assert mncore.metrics.fallback_ops() == {}
    torch.testing.assert_close(got, _fused_training("cpu", name, rate))


def test_an_in_place_op_run_eagerly_writes_copies_not_values_other_tensors_share(monkeypatch):
    """Before the rule above, ``Adam(fused=True, lr=tensor)`` ran eagerly on the device buffers themselves, and
    Adam's new ``exp_avg`` and ``exp_avg_sq``, both zeros, came out of one graph as one buffer: the step wrote
    the second moment into the first, then NaN. A mutating op without a shape rule still runs eagerly, on
    copies now; the rule is taken away here to send the fused step down that path (with a width no other test
    uses: shape inference runs once per signature)."""
    from mncore.trace import infer

    monkeypatch.delitem(infer._OWN_SHAPE_RULES, "_fused_adam_.tensor_lr")
    mncore.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mncore.ImplicitSyncWarning)  # the eager step reads its inputs
        got = _fused_training("mncore", "Adam", torch.tensor(0.1), width=7)
    assert mncore.metrics.fallback_ops() == {"_fused_adam_.tensor_lr": 4}
    torch.testing.assert_close(got, _fused_training("cpu", "Adam", torch.tensor(0.1), width=7))


def test_pdist_backward_with_fewer_gradient_values_than_pairs_is_refused_not_a_crash():
    """Found by fuzzing: CPU's ``_pdist_backward`` reads past a gradient or ``pdist`` holding fewer values than
    pairs of rows and the process dies (eager's too, so no eager reference here): mncore refuses the call,
    naming both counts. Likewise ``_weight_norm_interface_backward`` with norms of no elements, and
    ``_weight_norm_interface`` with a ``g`` of fewer values than ``v`` has slices (its kernel writes one norm
    per slice into a tensor shaped like ``g``: found corrupting the heap). Matching
    sizes, and more values than pairs (eager reads the first), give eager's gradient."""
    x = torch.randn(3, 2)
    with pytest.raises(RuntimeError, match=r"grad holds 2 values, but the kernel reads 3"):
        torch.ops.aten._pdist_backward.default(torch.ones(2).to("mncore"), x.to("mncore"), 2.0,
                                               torch.ones(3).to("mncore"))
    v = torch.randn(3, 2, 4)
    with pytest.raises(RuntimeError, match=r"saved_g holds 0 values, but the kernel reads 4"):
        torch.ops.aten._weight_norm_interface_backward.default(
            *[t.to("mncore") for t in (torch.ones(3, 2, 4), v, torch.ones(0, 0, 1), torch.ones(0, 0, 1))], 2)
    with pytest.raises(RuntimeError, match=r"g holds 2 values, but the kernel reads 4 .*one g value per slice"):
        torch.ops.aten._weight_norm_interface.default(v.to("mncore"), torch.ones(2, 1, 1).to("mncore"), 2)
    g = torch.rand(1, 1, 4) + 0.5
    for got, want in zip(torch.ops.aten._weight_norm_interface.default(v.to("mncore"), g.to("mncore"), 2),
                         torch.ops.aten._weight_norm_interface.default(v, g, 2)):
        torch.testing.assert_close(got.cpu(), want)
    for extra in (0, 2):
        dist, grad = torch.cat([torch.pdist(x), torch.ones(extra)]), torch.arange(3.0 + extra)
        want = torch.ops.aten._pdist_backward.default(grad, x, 2.0, dist)
        got = torch.ops.aten._pdist_backward.default(grad.to("mncore"), x.to("mncore"), 2.0, dist.to("mncore"))
        torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("loss", ["multi_margin_loss", "multilabel_margin_loss"])
def test_margin_losses_of_an_empty_batch_are_defined_not_uninitialised_memory(loss):
    """Found by fuzzing: CPU's kernels leave the mean or sum of an empty batch unwritten (eager returns what
    the allocation held, and two runs of mncore disagreed). mncore gives what PyTorch's other losses give
    for an empty batch (``mse_loss`` is the reference): NaN for the mean, 0 for the sum; a batch with rows
    still gets eager's loss."""
    fn = getattr(F, loss)

    def target(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.long) if loss == "multi_margin_loss" else torch.zeros(n, 4, dtype=torch.long)

    for reduction in ("mean", "sum", "none"):
        want = F.mse_loss(torch.empty(0), torch.empty(0), reduction=reduction)
        for _ in range(2):  # the value must not depend on what the allocation held before
            got = fn(torch.empty(0, 4).to("mncore"), target(0).to("mncore"), reduction=reduction)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True)
    x = torch.randn(3, 4, dtype=torch.float64)
    t = torch.tensor([1, 0, 3]) if loss == "multi_margin_loss" else torch.tensor([[1, 3, -1, 0], [0, -1, 2, 2], [2, 1, 0, 3]])
    torch.testing.assert_close(fn(x.to("mncore"), t.to("mncore")).cpu(), fn(x, t))


def test_weight_norm_backward_with_more_saved_g_values_than_slices_is_refused_not_garbage():
    """Found by fuzzing: ``_weight_norm_interface_backward`` writes one ``grad_g`` value per slice of ``v`` into
    a tensor shaped like ``saved_g``; a ``saved_g`` with more values left the rest unset (eager's too: two
    runs disagreed). mncore refuses it, naming both counts; the ``g`` the forward op takes (one value per
    slice) gives eager's gradients, in float64."""
    op = torch.ops.aten._weight_norm_interface_backward.default
    v = torch.randn(6, 2, 4, dtype=torch.float64)
    grad_w = torch.randn_like(v)
    for g in (torch.rand(1, 1, 4), torch.rand(2, 1, 4), torch.rand(6, 2, 4)):
        g = g.double() + 0.5
        norms = torch.rand_like(g) + 0.5
        if g.numel() == 4:
            for got, want in zip(op(*[t.to("mncore") for t in (grad_w, v, g, norms)], 2), op(grad_w, v, g, norms, 2)):
                torch.testing.assert_close(got.cpu(), want)
        else:
            with pytest.raises(RuntimeError, match=rf"saved_g holds {g.numel()} values, but v has 4 slices along dim 2"):
                op(*[t.to("mncore") for t in (grad_w, v, g, norms)], 2)


@pytest.mark.parametrize("kind", ["reflection", "replication"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_padding_backward_with_fewer_planes_than_the_input_is_refused_not_read_past(kind: str, k: int):
    """Found by fuzzing (NaN in the gradient, and a mismatch of 2e140 a fresh worker did not reproduce): CPU's
    reflection and replication padding backward kernels check the padded sizes of ``grad_output`` but read one
    of its planes per plane of the input, so a gradient of fewer batches or channels is read past its end,
    eager's too. mncore refuses it, naming both counts; the padding op's own gradient matches eager's in
    float64, batched and unbatched."""
    torch.manual_seed(k)
    pad = getattr(torch.nn, f"{kind.capitalize()}Pad{k}d")(1)
    backward = getattr(torch.ops.aten, f"{kind}_pad{k}d_backward")
    for shape in [(2, 3) + (4,) * k, (3,) + (4,) * k]:
        x = torch.randn(shape, dtype=torch.float64)
        grad = torch.randn(pad(x).shape, dtype=torch.float64)
        got = backward(grad.to("mncore"), x.to("mncore"), [1] * (2 * k))
        torch.testing.assert_close(got.cpu(), backward(grad, x, [1] * (2 * k)))
    with pytest.raises(RuntimeError, match="grad_output has 3 planes but the input 6, and the kernel reads a grad_output "
                                           "plane for each"):
        backward(torch.ones((1, 3) + (6,) * k).to("mncore"), torch.ones((2, 3) + (4,) * k).to("mncore"), [1] * (2 * k))

def test_pool_backward_with_planes_unlike_the_inputs_is_refused_not_a_crash():
    """Found by fuzzing (worker crashes a fresh worker did not reproduce): CPU's 2-D adaptive pooling backward
    ops (max and average) write the gradient of each ``grad_output`` plane into the input's plane of the same
    number, so more planes than the input has are written past its end; the 3-D ones read a ``grad_output``
    plane for each input plane, so fewer are read past (for max pooling, its indices too, and then written
    anywhere: a segmentation fault); ``fractional_max_pool3d_backward`` reads the gradient and indices as the
    input's planes. Eager's kernels do all this too. mncore refuses these calls, naming the counts; the safe
    direction (the kernel reads only what it needs, or leaves the other planes zero) still gives eager's
    gradient, and so does each op's own gradient in float64."""
    aten = torch.ops.aten
    long = dict(dtype=torch.long)

    def dev(*ts: torch.Tensor) -> list[torch.Tensor]:
        return [t.to("mncore") for t in ts]

    with pytest.raises(RuntimeError, match="grad_output has 6 planes but the input 2, and the kernel writes"):
        aten.adaptive_max_pool2d_backward(*dev(torch.ones(2, 3, 3, 3), torch.ones(2, 1, 6, 6), torch.zeros(2, 3, 3, 3, **long)))
    with pytest.raises(RuntimeError, match="grad_output has 3 planes but the input 2, and the kernel writes"):
        aten._adaptive_avg_pool2d_backward(*dev(torch.ones(3, 1, 3, 3), torch.ones(2, 1, 1, 1)))
    with pytest.raises(RuntimeError, match="grad_output has 1 planes but the input 3, and the kernel reads"):
        aten.adaptive_max_pool3d_backward(*dev(torch.ones(1, 1, 2, 2, 2), torch.ones(1, 3, 4, 4, 4),
                                               torch.zeros(1, 1, 2, 2, 2, **long)))
    with pytest.raises(RuntimeError, match="grad_output has 1 planes but the input 3, and the kernel reads"):
        aten._adaptive_avg_pool3d_backward(*dev(torch.ones(1, 1, 2, 2, 2), torch.ones(1, 3, 4, 4, 4)))
    safe = {  # the direction each kernel handles: eager's answer is defined there
        aten.adaptive_max_pool2d_backward: (torch.ones(2, 1, 3, 3), torch.ones(2, 3, 6, 6),
                                            torch.arange(9).reshape(1, 1, 3, 3).expand(2, 1, 3, 3) * 4),
        aten._adaptive_avg_pool2d_backward: (torch.ones(1, 1, 2, 2), torch.ones(1, 3, 4, 4)),
        aten._adaptive_avg_pool3d_backward: (torch.ones(1, 3, 2, 2, 2), torch.ones(1, 1, 4, 4, 4)),
    }
    for op, args in safe.items():
        torch.testing.assert_close(op(*dev(*args)).cpu(), op(*args))
    g, x, i = dev(torch.ones(2, 1, 2, 3, 3), torch.ones(2, 3, 4, 6, 6), torch.zeros(2, 1, 2, 3, 3, **long))
    with pytest.raises(RuntimeError, match="grad_output holds 36 values, but the kernel reads 108"):
        aten.fractional_max_pool3d_backward(g, x, [2, 2, 2], [2, 3, 3], i)
    torch.manual_seed(0)
    samples = torch.rand(2, 3, 3, dtype=torch.float64)  # fractional pooling's random offsets, one per plane
    for pool in (lambda t: F.adaptive_max_pool2d(t.flatten(1, 2), 3), lambda t: F.adaptive_max_pool3d(t, 2),
                 lambda t: F.adaptive_avg_pool2d(t.flatten(1, 2), 3), lambda t: F.adaptive_avg_pool3d(t, 3),
                 lambda t: F.fractional_max_pool3d(t, 2, output_size=2, _random_samples=samples.to(t.device))):
        x = torch.randn(2, 3, 4, 6, 6, dtype=torch.float64)
        xe, xd = x.clone().requires_grad_(), x.to("mncore").requires_grad_()
        pool(xe).pow(2).sum().backward()
        pool(xd).pow(2).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xe.grad)


def test_flash_attention_backward_with_tensors_unlike_the_forwards_is_refused_not_read_past():
    """Found by fuzzing (a NaN mismatch a fresh worker did not reproduce): CPU's flash-attention backward reads
    ``grad_out``, ``out`` and ``logsumexp`` by the query's sizes, so a gradient of one value per row was read
    32 values per row, past its end (eager's too), and it walks key and value by the query's batch, so a value
    of one batch for two had its gradient written past its end (the heap corrupted). mncore refuses tensors
    shaped unlike the forward op's results and a key or value that does not fit the query, naming the shapes;
    the forward's own results give eager's gradients in float64, and grouped-query heads stay allowed."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, n, 8, dtype=torch.float64) for n in (3, 2, 2))
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    grad = torch.randn_like(out)
    want = aten._scaled_dot_product_flash_attention_for_cpu_backward(grad, q, k, v, out, lse, 0.0, False)
    got = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        *[t.to("mncore") for t in (grad, q, k, v, out, lse)], 0.0, False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.cpu(), w)
    for bad, (g, o, m) in {"grad_out has shape \\[2, 4, 3, 1\\]": (grad[..., :1], out, lse),
                           "logsumexp has shape \\[2, 4, 1\\]": (grad, out, lse[..., :1])}.items():
        with pytest.raises(RuntimeError, match=bad + ", but the forward op gives"):
            aten._scaled_dot_product_flash_attention_for_cpu_backward(
                *[t.to("mncore") for t in (g, q, k, v, o, m)], 0.0, False)
    # a value of one batch for two: its gradient (shaped like it) was written past its end, eager's too
    with pytest.raises(RuntimeError, match=r"value \[1, 4, 2, 8\] do not fit"):
        aten._scaled_dot_product_flash_attention_for_cpu_backward(
            *[t.to("mncore") for t in (grad, q, k, v[:1], out, lse)], 0.0, False)
    with pytest.raises(RuntimeError, match=r"accepts only 4-D query, key and value .* got 3-D"):  # as eager's kernel
        aten._scaled_dot_product_flash_attention_for_cpu(*[t[0].to("mncore") for t in (q, k, v)], 0.0, False)
    with pytest.raises(RuntimeError, match=r"the query's heads must be a multiple of key's"):
        aten._scaled_dot_product_flash_attention_for_cpu(*[t.to("mncore") for t in (q[:, :3], k, v)], 0.0, False)
    k2, v2 = k[:, :2], v[:, :2]  # grouped-query attention: four query heads share two
    got = aten._scaled_dot_product_flash_attention_for_cpu(*[t.to("mncore") for t in (q, k2, v2)], 0.0, False)
    for g, w in zip(got, aten._scaled_dot_product_flash_attention_for_cpu(q, k2, v2, 0.0, False)):
        torch.testing.assert_close(g.cpu(), w)


def test_cdist_backward_with_fewer_gradient_values_than_pairs_is_refused_not_read_past():
    """Found by fuzzing (values up to 4e22 in the gradient): CPU's ``_cdist_backward`` reads one gradient and one
    distance per pair of rows, trusting ``grad_output`` and ``cdist`` to hold them. mncore refuses smaller ones,
    naming both counts; the forward's own tensors give eager's gradient in float64, batched too."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    x1, x2 = torch.randn(2, 4, 16, dtype=torch.float64), torch.randn(1, 3, 16, dtype=torch.float64)
    dist = torch.cdist(x1, x2)
    grad = torch.randn_like(dist)
    want = aten._cdist_backward(grad, x1, x2, 2.0, dist)
    got = aten._cdist_backward(*[t.to("mncore") for t in (grad, x1, x2)], 2.0, dist.to("mncore"))
    torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(RuntimeError, match="grad_output holds 8 values, but the kernel reads 24"):
        aten._cdist_backward(*[t.to("mncore") for t in (grad[:, :, :1], x1, x2)], 2.0, dist.to("mncore"))
    with pytest.raises(RuntimeError, match="cdist holds 12 values, but the kernel reads 24"):
        aten._cdist_backward(*[t.to("mncore") for t in (grad, x1, x2)], 2.0, dist[:1].to("mncore"))



def test_layer_norm_backward_with_a_short_gradient_or_statistics_is_refused_not_read_past():
    """Found by fuzzing ``mncore2:auto`` (NaN in one of two runs of the same case): CPU's
    ``native_layer_norm_backward`` reads ``grad_out`` as the input's values and ``mean`` and ``rstd`` as one per
    row, trusting their sizes; eager reads past smaller ones. mncore refuses them, naming both counts; the
    forward op's own tensors give eager's gradients in float64."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    _, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
    grad = torch.randn_like(x)
    want = aten.native_layer_norm_backward(grad, x, [8], mean, rstd, w, b, [True, True, True])
    got = aten.native_layer_norm_backward(*[t.to("mncore") for t in (grad, x)], [8], mean.to("mncore"), rstd.to("mncore"),
                                          w.to("mncore"), b.to("mncore"), [True, True, True])
    for g, e in zip(got, want):
        torch.testing.assert_close(g.cpu(), e)
    args = [t.to("mncore") for t in (grad, x, mean, rstd, w, b)]
    with pytest.raises(RuntimeError, match="grad_out holds 24 values, but the kernel reads 48"):
        aten.native_layer_norm_backward(args[0][:1], args[1], [8], *args[2:], [True, True, True])
    with pytest.raises(RuntimeError, match="rstd holds 3 values, but the kernel reads 6"):
        aten.native_layer_norm_backward(args[0], args[1], [8], args[2], args[3][:1], *args[4:], [True, True, True])

_M_PERTURB = -6  # glibc's mallopt parameter


@contextlib.contextmanager
def _allocations_filled() -> Iterator[None]:
    """glibc fills every block malloc hands out with one byte pattern (``mallopt(M_PERTURB)``) meanwhile: memory
    a kernel leaves unset reads as that pattern, not as the zeros of fresh pages."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallopt") or libc.mallopt(_M_PERTURB, 0x5A) != 1:
        pytest.skip("needs glibc's mallopt(M_PERTURB)")
    try:
        yield
    finally:
        libc.mallopt(_M_PERTURB, 0)


def test_grouped_mm_is_zero_on_rows_no_group_covers():
    """Eager's ``_grouped_mm`` and its backward write only the rows the groups cover and leave the others as
    the allocation held them (found by fuzzing: up to 3e29 in a gradient); on mncore they are zero, the sum
    over nothing, in the output and the gradient, and both equal eager's on the covered rows. 2-D by 2-D, a
    group with an empty share of the inner dimension is zero likewise."""
    torch.manual_seed(0)
    a, b = torch.randn(12, 8, requires_grad=True), torch.randn(2, 8, 8, requires_grad=True)
    offs = torch.tensor([3, 7], dtype=torch.int32)  # rows 7..11 belong to no group
    w = torch.randn(12, 8)
    want = torch.ops.aten._grouped_mm(a, b, offs)
    (want * w).sum().backward()
    da, db = (t.detach().to("mncore").requires_grad_() for t in (a, b))
    with _allocations_filled():
        got = torch.ops.aten._grouped_mm(da, db, offs.to("mncore"))
        (got * w.to("mncore")).sum().backward()
        flat = torch.ops.aten._grouped_mm(a.detach()[:4].mncore(), b.detach()[0].mncore(),
                                          torch.tensor([4, 4, 8], dtype=torch.int32).mncore()).cpu()
    torch.testing.assert_close(got.detach().cpu()[:7], want.detach()[:7])
    torch.testing.assert_close(da.grad.cpu()[:7], a.grad[:7])
    torch.testing.assert_close(db.grad.cpu(), b.grad)
    for unset in (got.detach().cpu()[7:], da.grad.cpu()[7:], flat[1]):
        assert torch.count_nonzero(unset) == 0
    ad, bd = a.detach()[:4], b.detach()[0]
    torch.testing.assert_close(flat[0], ad[:, :4] @ bd[:4])
    torch.testing.assert_close(flat[2], ad[:, 4:] @ bd[4:])


def test_onednn_rnn_layer_with_tensors_unlike_its_input_is_refused_not_a_crash():
    """Found by fuzzing (an eager crash that killed the worker's later cases): oneDNN's RNN layer backward sizes
    everything from the time-major input and ``hidden_size`` and trusts the weights, states, outputs, gradients
    and its workspace to match; an ``hx`` of one row for four, or a workspace cut short, were read and written
    past (eager's too). mncore refuses them, naming the shapes; the forward op's own results give eager's
    gradients."""
    aten = torch.ops.aten
    torch.manual_seed(0)
    steps, batch, features, hidden = 5, 3, 4, 6
    x, hx, cx = torch.randn(steps, batch, features), torch.randn(batch, hidden), torch.randn(batch, hidden)
    weights = [torch.randn(4 * hidden, features) * 0.3, torch.randn(4 * hidden, hidden) * 0.3,
               torch.randn(4 * hidden) * 0.1, torch.randn(4 * hidden) * 0.1]
    out, hy, cy, workspace = aten.mkldnn_rnn_layer(x, *weights, hx, cx, False, [], 2, hidden, 1, True, False, False, True)
    grad = torch.randn_like(out)

    def backward(*tensors: torch.Tensor) -> tuple:
        *front, ws = tensors
        return aten.mkldnn_rnn_layer_backward(*front, None, None, False, 2, hidden, 1, True, True, False, [], False, ws)

    given = [x, *weights, hx, cx, out, hy, cy, grad, workspace]
    want = backward(*given)
    for grad_mode in (True, False):  # autograd runs backward ops with gradients off
        with torch.set_grad_enabled(grad_mode):
            got = backward(*[t.to("mncore") for t in given])
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w)
    with pytest.raises(RuntimeError, match=r"hx has shape \[1, 6\], but an input of shape \[5, 3, 4\]"):
        backward(*[t.to("mncore") for t in given[:5] + [hx[:1]] + given[6:]])
    with pytest.raises(RuntimeError, match=f"workspace holds 1 values, but oneDNN needs {workspace.numel()}"):
        backward(*[t.to("mncore") for t in given[:-1] + [workspace[:1]]])
    with torch.no_grad(), pytest.raises(RuntimeError, match="workspace holds 1 values, but oneDNN needs"):
        backward(*[t.to("mncore") for t in given[:-1] + [workspace[:1]]])
    short = [w[:hidden] for w in weights]  # a weight of one gate for four: the forward reads it past its end
    with pytest.raises(RuntimeError, match=r"input weight has shape \[6, 4\], but .* need \[24, 4\]"):
        aten.mkldnn_rnn_layer(x.mncore(), *[w.mncore() for w in short], hx.mncore(), cx.mncore(), False, [], 2,
                              hidden, 1, True, False, False, True)


def test_roi_ops_match_eager_and_refuse_a_box_naming_an_image_outside_the_batch():
    """Found by fuzzing (NaN in ``roi_align``'s gradient): torchvision's RoI kernels read, and their backward
    kernels write, the image that column 0 of each box names, unchecked. mncore runs them as eager does (float64,
    gradient too) and refuses a box naming an image the batch lacks, naming the index, and a backward op's
    gradient shaped unlike the forward output (read by that shape)."""
    torchvision = pytest.importorskip("torchvision")
    ops = torchvision.ops
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 0.0, 0.0, 5.0, 5.0], [1, 2.0, 1.0, 7.0, 6.0]], dtype=torch.float64)
    xm = x.detach().mncore().requires_grad_()
    for name, run in {"roi_align": lambda t, r: ops.roi_align(t, r, (2, 2), 1.0, 2),
                      "ps_roi_pool": lambda t, r: ops.ps_roi_pool(t, r, (2, 2))}.items():
        x.grad = xm.grad = None
        want = run(x, rois)
        g = torch.randn_like(want)
        want.backward(g)
        got = run(xm, rois.mncore())
        got.backward(g.mncore())
        torch.testing.assert_close(got.cpu(), want, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(xm.grad.cpu(), x.grad, msg=lambda m: f"{name} grad: {m}")
    backward = torch.ops.torchvision._roi_align_backward
    for short in (torch.ones(1, 4, 2, 2), torch.ones(2, 4, 4, 1)):
        with pytest.raises(RuntimeError, match=r"grad has shape .* make the forward output \[2, 4, 2, 2\]"):
            backward(short.double().mncore(), rois.mncore(), 1.0, 2, 2, 2, 4, 8, 8, 2, False)
    # an empty gradient is not read, whatever its shape (found fuzzing: [0, 1, 7, 7] for [0, 256, 7, 7])
    none = rois[:0]
    torch.testing.assert_close(backward(torch.ones(0, 1, 2, 2).double().mncore(), none.mncore(), 1.0, 2, 2, 2, 4, 8,
                                        8, 2, False).cpu(),
                               backward(torch.ones(0, 1, 2, 2).double(), none, 1.0, 2, 2, 2, 4, 8, 8, 2, False))
    bad = rois.clone()
    bad[1, 0] = 5.0
    grad = torch.ones(2, 4, 2, 2, dtype=torch.float64).mncore()
    for name, run in {"roi_align": lambda: ops.roi_align(xm.detach(), bad.mncore(), (2, 2), 1.0, 2),
                      "_roi_align_backward": lambda: backward(grad, bad.mncore(), 1.0, 2, 2, 2, 4, 8, 8, 2, False)}.items():
        out = run()
        mncore.sync()
        with pytest.raises(mncore.DeviceExecutionError, match=f"{name}: a box names image 5 of a batch of 2"):
            mncore.wait_device_ops()
        with pytest.raises(mncore.DeviceExecutionError):
            out.cpu()
    # the backward kernels take rois of any width and read a box as 5 values from its start (found fuzzing: a
    # SIGSEGV for 6 columns, where box 1's image is value 5: -1 here)
    wide = torch.cat([rois, rois[:, :1]], 1)
    wide[0, 5] = -1.0
    out = backward(grad, wide.mncore(), 1.0, 2, 2, 2, 4, 8, 8, 2, False)
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match="_roi_align_backward: a box names image -1 of a batch of 2"):
        mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        out.cpu()
    # a kernel with nothing to compute reads no box: as eager, an empty result
    empty = torch.zeros(2, 0, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(ops.roi_align(empty.mncore(), bad.mncore(), (2, 2), 1.0, 2).cpu(),
                               ops.roi_align(empty, bad, (2, 2), 1.0, 2))


def test_kernels_that_divide_by_an_empty_size_are_refused_not_a_crash():
    """Found by fuzzing (seeds 20261231-2): the fuzzer, when eager's kernel killed its worker, ran the case on
    mncore alone, which died too (pfvm runs the same CPU kernels): weight norm of a ``v`` with no slices
    along ``dim`` and CPU flash attention of an empty query or key length (SIGFPE: the kernels divide by
    these sizes), adaptive pooling backward of an input empty in a pooled dimension (SIGSEGV), and average
    pooling and 3-D max pooling backward of a ``grad_output`` with another batch than the input's (their
    kernels check every other size; heap corruption). mncore refuses each call, naming the sizes; the same
    ops on well-formed inputs of the same kinds still give eager's results, in float64."""
    aten = torch.ops.aten
    f64 = dict(dtype=torch.float64)

    def dev(*ts: torch.Tensor) -> list[torch.Tensor]:
        return [t.to("mncore") for t in ts]

    with pytest.raises(RuntimeError, match=r"_weight_norm_interface: v \[32, 2, 0\] has no slices along dim 2"):
        aten._weight_norm_interface(*dev(torch.ones(32, 2, 0), torch.ones(1, 1, 0)), 2)
    with pytest.raises(RuntimeError, match=r"_weight_norm_interface_backward: v \[0, 3\] has no slices along dim 0"):
        aten._weight_norm_interface_backward(*dev(torch.ones(0, 3), torch.ones(0, 3), torch.ones(0, 1),
                                                  torch.ones(0, 1)), 0)
    v, g = torch.randn(3, 0, **f64), torch.rand(3, 1, **f64)  # slices of no values: defined, and eager's
    for got, want in zip(aten._weight_norm_interface(*dev(v, g), 0), aten._weight_norm_interface(v, g, 0)):
        _same(got, want)
    flash = aten._scaled_dot_product_flash_attention_for_cpu
    for q, kv in (((2, 2, 0, 8), (2, 2, 3, 8)), ((2, 2, 3, 8), (2, 2, 0, 8)), ((0, 2, 0, 8), (0, 2, 3, 8))):
        with pytest.raises(RuntimeError, match="has length 0, and the CPU kernel divides its work by the lengths"):
            flash(*dev(torch.ones(q), torch.ones(kv), torch.ones(kv)))
    q, k, val = (torch.randn(s, **f64) for s in ((0, 2, 3, 8), (0, 2, 3, 8), (0, 2, 3, 8)))  # no batch: fine
    for got, want in zip(flash(*dev(q, k, val)), flash(q, k, val)):
        _same(got, want)
    for op, k in ((aten._adaptive_avg_pool2d_backward, 2), (aten._adaptive_avg_pool3d_backward, 3)):
        with pytest.raises(RuntimeError, match="has size 0 in a pooled dimension, which the forward op refuses"):
            op(*dev(torch.ones((2, 4) + (3,) * k), torch.ones((2, 4, 0) + (5,) * (k - 1))))
    with pytest.raises(RuntimeError, match="has size 0 in a pooled dimension"):
        aten.adaptive_max_pool2d_backward(*dev(torch.ones(2, 4, 3, 3), torch.ones(2, 4, 5, 0),
                                               torch.zeros(2, 4, 3, 3, dtype=torch.long)))
    with pytest.raises(RuntimeError, match="avg_pool2d_backward: grad_output has a batch of 3 but the input 2"):
        aten.avg_pool2d_backward(*dev(torch.ones(3, 8, 2, 2), torch.ones(2, 8, 4, 4)), [2, 2], [2, 2], [0, 0],
                                 False, True, None)
    with pytest.raises(RuntimeError, match="avg_pool3d_backward: grad_output has a batch of 1 but the input 2"):
        aten.avg_pool3d_backward(*dev(torch.ones(1, 8, 2, 2, 2), torch.ones(2, 8, 4, 4, 4)), [2] * 3, [2] * 3,
                                 [0] * 3, False, True, None)
    with pytest.raises(RuntimeError, match="max_pool3d_with_indices_backward: grad_output has a batch of 3 but"):
        aten.max_pool3d_with_indices_backward(*dev(torch.ones(3, 3, 2, 2, 2), torch.ones(2, 3, 4, 4, 4)), [2] * 3,
                                              [2] * 3, [0] * 3, [1] * 3, False,
                                              torch.zeros(3, 3, 2, 2, 2, dtype=torch.long).to("mncore"))
    for pool in (lambda t: F.avg_pool2d(t.flatten(1, 2), 2), lambda t: F.avg_pool3d(t, 2),
                 lambda t: F.max_pool3d(t, 2), lambda t: F.adaptive_avg_pool3d(t, 3)):
        x = torch.randn(2, 3, 4, 6, 6, **f64)  # each op's own gradient: eager's
        xe, xd = x.clone().requires_grad_(), x.to("mncore").requires_grad_()
        pool(xe).pow(2).sum().backward()
        pool(xd).pow(2).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xe.grad)


def test_pooling_and_roi_backward_reading_past_a_short_argument_is_refused_not_a_crash():
    """Found by the fuzzer's ``lazy_alone`` oracle (mncore died on cases eager's kernel died on):
    ``max_pool3d_with_indices_backward`` reads one index per gradient value without checking ``indices``' size
    (the 2-D op checks it), torchvision's RoI backward kernels read 5 values per box from ``rois`` of any
    width (SIGSEGV for boxes of no columns), and RoI align (plain and position-sensitive) samples an image of
    no rows or columns before its start. mncore refuses these, naming the sizes; indices of the gradient's
    shape and boxes of 5 columns give eager's gradients, in float64, and empty images without boxes eager's
    empty result."""
    aten = torch.ops.aten
    grad, x = torch.randn(2, 3, 2, 2, 2, dtype=torch.float64), torch.randn(2, 3, 4, 4, 4, dtype=torch.float64)
    pool = [[2] * 3, [2] * 3, [0] * 3, [1] * 3, False]
    with pytest.raises(RuntimeError, match="indices holds 24 values, but the kernel reads 48"):
        aten.max_pool3d_with_indices_backward(grad.mncore(), x.mncore(), *pool,
                                              torch.zeros(1, 3, 2, 2, 2, dtype=torch.long).mncore())
    _, indices = F.max_pool3d(x, 2, return_indices=True)
    _same(aten.max_pool3d_with_indices_backward(grad.mncore(), x.mncore(), *pool, indices.mncore()),
          aten.max_pool3d_with_indices_backward(grad, x, *pool, indices))
    pytest.importorskip("torchvision")  # registers torch.ops.torchvision
    backward = torch.ops.torchvision._roi_align_backward
    rois = torch.tensor([[0, 0.0, 0.0, 5.0, 5.0]], dtype=torch.float64)
    g = torch.randn(1, 4, 2, 2, dtype=torch.float64)
    for narrow in (rois[:, :0], rois[:, :4]):
        with pytest.raises(RuntimeError, match=rf"rois has shape \[1, {narrow.shape[1]}\], but the kernel reads 5 values"):
            backward(g.mncore(), narrow.mncore(), 1.0, 2, 2, 1, 4, 8, 8, 2, False)
    _same(backward(g.mncore(), rois.mncore(), 1.0, 2, 2, 1, 4, 8, 8, 2, False),
          backward(g, rois, 1.0, 2, 2, 1, 4, 8, 8, 2, False))
    # RoI align samples each box from the image: an image of no rows or columns was read before its start
    # (found by the lazy_alone oracle: SIGSEGV); with no boxes, or no channels, nothing is read
    align, ps_align = torch.ops.torchvision.roi_align, torch.ops.torchvision.ps_roi_align
    for op, run in ((align, lambda x, r: align(x, r, 1.0, 2, 2, 2, False)), (ps_align, lambda x, r: ps_align(x, r, 1.0, 2, 2, 2))):
        for empty in (torch.ones(1, 4, 0, 2, dtype=torch.float64), torch.ones(1, 4, 3, 0, dtype=torch.float64)):
            with pytest.raises(RuntimeError, match="has images with no rows or columns"):
                run(empty.mncore(), rois.mncore())
            _same(run(empty.mncore(), rois[:0].mncore())[0] if op is ps_align else run(empty.mncore(), rois[:0].mncore()),
                  run(empty, rois[:0])[0] if op is ps_align else run(empty, rois[:0]))
