"""Semantic conformance of the lazy ``mncore`` device against eager PyTorch on CPU.

Every test runs the same code twice, once on CPU tensors (the reference) and once on
``mncore`` tensors, calls ``mncore.sync()`` and compares the results (and, for in-place
code, the mutated inputs and every view created along the way) with
``torch.testing.assert_close``; exactly where both sides run the same CPU kernel.
"""
from __future__ import annotations

import copy
import gc
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import mncore

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _lazy_cpu():
    mncore.init_cpu(implicit_sync="silent")
    torch.manual_seed(0)
    yield
    mncore.sync()
    mncore.wait_device_ops()


# ---------------------------------------------------------------------------------------------
# helpers


def _to_dev(a):
    if isinstance(a, torch.Tensor):
        return a.detach().to("mncore").requires_grad_(a.requires_grad)
    if isinstance(a, (list, tuple)):
        return type(a)(_to_dev(x) for x in a)
    return a


def _clone_cpu(a):
    if isinstance(a, torch.Tensor):
        return a.detach().clone().requires_grad_(a.requires_grad)
    if isinstance(a, (list, tuple)):
        return type(a)(_clone_cpu(x) for x in a)
    return a


def assert_same(dev, ref, exact=True, path="out", **tol):
    """``dev`` (mncore results) equals ``ref`` (eager CPU results), structurally and by value."""
    if isinstance(ref, torch.Tensor):
        assert isinstance(dev, torch.Tensor), f"{path}: expected a tensor, got {type(dev)}"
        assert dev.device.type == "mncore", f"{path}: expected an mncore tensor, got {dev.device}"
        assert dev.shape == ref.shape, f"{path}: shape {tuple(dev.shape)} != {tuple(ref.shape)}"
        assert dev.dtype == ref.dtype, f"{path}: dtype {dev.dtype} != {ref.dtype}"
        got = dev.detach().cpu()
        if exact:
            torch.testing.assert_close(got, ref.detach(), rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{path}: {m}")
        else:
            torch.testing.assert_close(got, ref.detach(), equal_nan=True, msg=lambda m: f"{path}: {m}", **tol)
    elif isinstance(ref, (list, tuple)):
        assert isinstance(dev, (list, tuple)), f"{path}: expected a sequence, got {type(dev)}"
        assert len(dev) == len(ref), f"{path}: length {len(dev)} != {len(ref)}"
        for i, (d, r) in enumerate(zip(dev, ref)):
            assert_same(d, r, exact, f"{path}[{i}]", **tol)
    elif isinstance(ref, dict):
        assert set(dev) == set(ref), path
        for k in ref:
            assert_same(dev[k], ref[k], exact, f"{path}[{k!r}]", **tol)
    else:
        assert dev == ref, f"{path}: {dev!r} != {ref!r}"


def run_both(fn, *inputs, exact=True, check_inputs=True, allow_implicit_sync=False, **tol):
    """Run ``fn`` on CPU clones and on mncore copies of ``inputs``; compare outputs and inputs."""
    cpu_in = [_clone_cpu(a) for a in inputs]
    dev_in = [_to_dev(a) for a in inputs]
    mncore.sync()
    ref = fn(*cpu_in)
    before = mncore.metrics.counters()["implicit_syncs"]
    out = fn(*dev_in)
    if not allow_implicit_sync:
        assert mncore.metrics.counters()["implicit_syncs"] == before, "unexpected implicit sync while tracing"
    mncore.sync()
    assert_same(out, ref, exact, "out", **tol)
    if check_inputs:
        assert_same(dev_in, cpu_in, exact, "inputs", **tol)
    return out, ref


def _grid(*shape, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    return torch.arange(n, dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# views and in-place writes


@pytest.mark.parametrize("value", ["row", "block", "scalar", "zero_dim", "int_row", "cpu_zero_dim"])
def test_slice_assignment(value):
    vals = {
        "row": torch.tensor([-1.0, -2.0, -3.0, -4.0]),
        "block": -_grid(2, 4),
        "scalar": 7.5,
        "zero_dim": torch.tensor(-9.0),
        "int_row": torch.tensor([1, 2, 3, 4]),
    }

    def f(x, v):
        before = x[1:]
        col = x[:, 2]
        x[1:3] = v
        after = x[2:]
        return x, before, col, after

    if value == "cpu_zero_dim":
        # a 0-dim host tensor is allowed as the source for a device destination
        def g(x):
            return f(x, torch.tensor(3.25))

        run_both(g, _grid(5, 4))
    else:
        run_both(f, _grid(5, 4), vals[value])


def test_inplace_add_through_slice_view():
    def f(x):
        col = x[:, 1]
        tail = x[1:]
        tail += 1
        x[1:] += 10  # Python-level augmented assignment on a subscript
        late = x[2]
        return x, col, tail, late

    run_both(f, _grid(4, 3))


def test_transpose_view_inplace():
    def f(x):
        row = x[0]
        xt = x.t()
        xt.mul_(2)
        xt[0, 1] = 100.0
        xt2 = x.transpose(0, 1)
        xt2[2].neg_()
        return x, row, xt, xt2

    run_both(f, _grid(3, 4))


def test_permute_view_inplace():
    def f(x):
        early = x[:, 1]
        p = x.permute(2, 0, 1)
        p[1].add_(100)
        p.mul_(2)
        return x, early, p

    run_both(f, _grid(2, 3, 4))


def test_view_then_inplace():
    def f(x):
        flat = x.view(12)
        y = x.view(2, 6)
        y.add_(1)
        y[1].mul_(3)
        z = x.view(-1, 3)
        z[:, 0] = 0.5
        r = x.reshape(4, 3)  # contiguous: reshape is a view
        r[3, 2] = 42.0
        return x, flat, y, z, r

    run_both(f, _grid(3, 4))


def test_reshape_of_noncontiguous_is_a_copy():
    def f(x):
        r = x.t().reshape(-1)  # a copy on eager: writes must not reach x
        r.fill_(0)
        c = x.t().contiguous()
        c.add_(1)
        return x, r, c

    run_both(f, _grid(3, 4))


def test_select_then_inplace():
    def f(x):
        early = x[:, 2]
        r = x.select(1, 2)
        r.sub_(5)
        x[0].fill_(0)
        x.select(0, -1).mul_(-1)
        return x, early, r

    run_both(f, _grid(3, 4))


def test_unsqueeze_squeeze_views_written_through():
    def f(x):
        early = x[1]
        u = x.unsqueeze(0)
        u.mul_(2)
        s = x.view(1, 3, 1, 4).squeeze()
        s.add_(1)
        s1 = x.unsqueeze(1).squeeze(1)
        s1[0, 0] = -7.0
        u2 = x.unsqueeze(-1)
        u2[2, 3, 0] = 99.0
        return x, early, u, s, s1, u2

    run_both(f, _grid(3, 4))


def test_split_chunk_unbind_written_in_place():
    def f(x):
        a, b = x.split(2, dim=0)
        a.add_(10)
        b.mul_(-1)
        c = x.chunk(2, dim=1)
        c[1].zero_()
        rows = x.unbind(0)
        rows[0].fill_(7)
        p, q = x.split([1, 3], dim=1)
        q.sub_(0.5)
        return x, a, b, c, rows, p, q

    run_both(f, _grid(4, 4))


def test_column_zero_():
    def f(x):
        early = x[1:, :2]
        x[:, 0].zero_()
        return x, early

    run_both(f, _grid(3, 4))


@pytest.mark.parametrize("offset", [0, 1, -1])
def test_diagonal_fill_(offset):
    def f(x):
        early = x[1]
        d = x.diagonal(offset)
        d.fill_(-1.0)
        d2 = x.diagonal(offset=0, dim1=1, dim2=0)
        d2.add_(0.25)
        return x, early, d, d2

    run_both(f, _grid(4, 4))


def test_diagonal_fill_3d():
    def f(x):
        d = x.diagonal(0, 1, 2)
        d.fill_(5.0)
        return x, d

    run_both(f, _grid(2, 3, 3))


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_tensor_indices(accumulate):
    def f(x, i, j, v):
        early = x[1]
        x.index_put_((i, j), v, accumulate=accumulate)
        return x, early

    i = torch.tensor([0, 1, 2, 1])
    j = torch.tensor([1, 2, 0, 2])
    run_both(f, _grid(3, 4), i, j, torch.tensor([10.0, 20.0, 30.0, 40.0]))


def test_index_put_row_indices_setitem():
    def f(x, idx, v):
        early = x[:, 0]
        x[idx] = v
        return x, early

    run_both(f, _grid(5, 3), torch.tensor([4, 0]), torch.tensor([-1.0, -2.0, -3.0]))


def test_index_put_bool_mask():
    def f(x, m):
        early = x[0]
        x.index_put_((m,), torch.tensor(-1.0, device=x.device))
        x[x > 8] = 0.0
        return x, early

    x = _grid(3, 4)
    run_both(f, x, (x % 3) == 0, allow_implicit_sync=True)


def test_masked_fill_():
    def f(x, m):
        early = x[1:]
        x.masked_fill_(m, -1.0)
        x.masked_fill_(x > 9, torch.tensor(100.0, device=x.device))
        x[0].masked_fill_(m[0], 3.0)
        return x, early

    x = _grid(3, 4)
    run_both(f, x, (x % 2) == 1)


def test_copy_lazy_from_lazy_broadcast_and_cast():
    def f(x, src_row, src_block):
        early = x[1]
        x.copy_(src_row)  # int64 (4,) -> float32 (3, 4): broadcast + cast
        x[:, 1:3].copy_(src_block)  # float64 (3, 2) into a view
        return x, early

    run_both(f, _grid(3, 4), torch.tensor([1, 2, 3, 4]), torch.full((3, 2), 0.5, dtype=torch.float64))


def test_copy_lazy_from_cpu():
    host_t = _grid(4, 3).t() + 100  # non-contiguous host source
    host_row = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    host_col = _grid(3, 3)[:, 1]  # non-contiguous 1-d source

    def f(x):
        early = x[2]
        col = x[:, 0]
        x.copy_(host_t)  # whole tensor <- host
        x[1].copy_(host_row)  # view <- host, int32 -> float32
        x[:, 0].copy_(host_col)
        x[2:].copy_(host_row)  # broadcast + cast from host
        x[0, 3].copy_(torch.tensor(-5.0))  # 0-dim
        return x, early, col

    run_both(f, _grid(3, 4))


def test_copy_cpu_from_lazy():
    src = _grid(3, 4)
    dev = src.to("mncore")
    dev.mul_(2)
    host = torch.zeros(3, 4)
    host.copy_(dev)  # reads the pending value
    torch.testing.assert_close(host, src * 2, rtol=0, atol=0)
    host64 = torch.zeros(2, 3, 4, dtype=torch.float64)
    host64.copy_(dev)  # broadcast + cast
    torch.testing.assert_close(host64, (src * 2).double().expand(2, 3, 4), rtol=0, atol=0)
    host_t = torch.zeros(4, 3)
    host_t.t().copy_(dev[:, :])  # into a non-contiguous host view
    torch.testing.assert_close(host_t, (src * 2).t(), rtol=0, atol=0)


def test_clamp_():
    def f(x, lo, hi):
        early = x[0]
        x.clamp_(min=-3.0, max=4.0)
        x[1:].clamp_(max=0.0)
        y = x * 1
        y.clamp_(lo, hi)
        return x, early, y

    x = _grid(3, 4) - 5
    run_both(f, x, torch.full((4,), -1.0), torch.tensor([0.0, 1.0, 2.0, 3.0]))


def test_out_variants():
    def f(a, b, c, base, s):
        r1 = torch.add(a, b, out=c)
        early = base[0]
        r2 = torch.mul(a[0], b[0], out=base[1])
        r3 = torch.sum(a, 0, out=s)
        return r1, c, base, early, r2, r3, s

    out, _ = run_both(f, _grid(3, 4), torch.full((3, 4), 0.5), torch.zeros(3, 4), torch.zeros(3, 4), torch.zeros(4))


def test_out_returns_the_out_tensor():
    a = _grid(2, 3).to("mncore")
    c = torch.empty(2, 3, device="mncore")
    r = torch.add(a, a, out=c)
    assert r is c
    r2 = torch.mul(a, 2, out=c)
    assert r2 is c
    mncore.sync()
    torch.testing.assert_close(c.cpu(), _grid(2, 3) * 2, rtol=0, atol=0)


def test_out_with_dtype_cast():
    def f(a, b, c):
        torch.add(a, b, out=c)  # int64 result written to a float32 out
        return c

    run_both(f, torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]), torch.zeros(3))


@pytest.mark.parametrize("out_shape", [(0,), (2,), (3, 2), (4, 3)])
def test_out_of_another_shape_is_resized_as_eager_resizes_it(out_shape):
    """An out= tensor takes the result's shape, as in eager: an empty one silently (``out=torch.empty(0)``),
    one with elements with a deprecation warning. Found by fuzzing: a one-element result written into an
    empty out= tensor broadcast to nothing (the out= tensor stayed empty), and into a larger one
    broadcast over it."""
    for a, b in ((_grid(1), _grid(1) + 2), (_grid(3, 4), _grid(3, 4) - 5)):
        def f(a, b, c):
            torch.maximum(a, b, out=c)
            return c

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, ref = run_both(f, a, b, torch.zeros(out_shape), check_inputs=False)
        assert out.shape == ref.shape == a.shape
        resized = [w for w in caught if "mncore" in str(w.message) and "was resized" in str(w.message)]
        assert len(resized) == (1 if 0 not in out_shape and out_shape != tuple(a.shape) else 0), caught


def test_copy_from_noncontiguous_host_keeps_destination_layout():
    src = _grid(3, 4).t()
    ref = torch.empty(4, 3)
    ref.copy_(src)
    dev = torch.empty(4, 3, device="mncore")
    dev.copy_(src)
    a = dev.as_strided((2, 2), (3, 1), 1)
    mncore.sync()
    assert_same(dev, ref)
    host = dev.cpu()
    assert host.stride() == ref.stride()
    assert host.view(-1).tolist() == ref.view(-1).tolist()
    assert_same(a, ref.as_strided((2, 2), (3, 1), 1))


def test_view_of_view_chain_writes():
    def f(x):
        early = x[:, 1:]
        v = x[1:][:, ::2]
        w = v.t()
        w[0] = -1.0
        w[1, 1:] += 100
        return x, early, v, w

    run_both(f, _grid(4, 5))


def test_detach_shares_storage():
    def f(x):
        d = x.detach()
        d.add_(1)
        x[0] = 0.0
        return x, d

    run_both(f, _grid(2, 3))


def test_view_reads_after_base_write():
    def f(x):
        v = x[1:]
        y1 = v * 2  # reads the view before the write
        x.add_(1)
        y2 = v * 2  # must read the new value
        x.zero_()
        y3 = v + 1
        return x, v, y1, y2, y3

    run_both(f, _grid(3, 3))


def test_write_after_read_keeps_old_value():
    def f(x):
        y = x * 2
        v = x[0]
        s = v.sum()
        x.add_(1)
        v.mul_(0)
        return x, y, s, v

    run_both(f, _grid(2, 3))


def test_views_across_syncs():
    ref = _grid(3, 4)
    dev = ref.clone().to("mncore")
    out = []
    for t in (ref, dev):
        v = t[1:]
        c = t[:, 0]
        if t is dev:
            mncore.sync()
        v.add_(1)
        if t is dev:
            mncore.sync()
        c.mul_(10)
        t.t()[3].fill_(-2)
        if t is dev:
            mncore.sync()
        out.append((t, v, c))
    mncore.sync()
    assert_same(out[1], out[0])


def test_a_view_kept_across_a_sync_holds_no_old_graph_or_buffers():
    """Linear's ``.grad`` tensors are views. After each step's sync exactly the parameters and
    their gradients are on the device: a view's cached traced value must not keep the previous
    step's graph alive, with the input batch and the old parameter values it read."""
    torch.manual_seed(0)
    mncore.sync()
    mncore.wait_device_ops()
    gc.collect()
    base = mncore.metrics.counters()["live_buffers"]  # what earlier tests in this process still hold
    ref = nn.Linear(4, 3)
    dev = copy.deepcopy(ref).to("mncore")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, dev)]
    live = []
    for step in range(4):
        x = torch.randn(2, 4)
        for m, opt, xx in ((ref, opts[0], x), (dev, opts[1], x.to("mncore"))):
            opt.zero_grad()
            m(xx).square().sum().backward()
            opt.step()
        del xx
        mncore.sync()
        mncore.wait_device_ops()
        assert all(p.grad.mn_chain for p in dev.parameters())  # the case under test: grads are views
        gc.collect()  # what is unreachable does not count; the old graph was reachable, from the grads
        live.append(mncore.metrics.counters()["live_buffers"] - base)
    assert live == [4, 4, 4, 4]  # weight, bias and their two gradients; nothing of older steps
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.cpu(), p_ref)
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad)


def test_expand_write_raises_like_eager():
    for t in (torch.zeros(1, 3), torch.zeros(1, 3).to("mncore")):
        e = t.expand(4, 3)
        with pytest.raises(RuntimeError):
            e.add_(1)


def test_write_through_select_of_expand_is_refused():
    """Which base element a write through expand() lands on is not tracked: refused, never guessed."""
    x = _grid(3, 4).to("mncore")
    e = x[0:1].expand(3, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        e[0].fill_(1.0)




def test_unfold_view_sees_base_write():
    def f(x):
        u = x.unfold(0, 2, 1)
        x.add_(1)
        return x, u

    run_both(f, torch.arange(5.0))


def test_view_dtype_sees_base_write():
    def f(x):
        u = x.view(torch.int32)
        x.add_(1)
        return x, u

    run_both(f, torch.arange(4.0))


# ---------------------------------------------------------------------------------------------
# ops with mutable arguments




def _bn_stats_run(dev, x, stat_views=False, weight=True):
    torch.manual_seed(1)
    if stat_views:
        stats = torch.stack([torch.zeros(3), torch.ones(3)]).to(dev)
        rm, rv = stats[0], stats[1]
    else:
        stats = None
        rm, rv = torch.zeros(3).to(dev), torch.ones(3).to(dev)
    w = (torch.rand(3) + 0.5).to(dev) if weight else None
    b = torch.randn(3).to(dev) if weight else None
    if dev == "mncore":
        mncore.sync()
    x = x.to(dev)
    early = rm[:]  # a view of the running mean created before the update
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    read_before_sync = (rm.cpu().clone(), rv.cpu().clone())  # an (implicit) host read must see the update (clone: on CPU .cpu() aliases)
    y2 = F.batch_norm(x * 2, rm, rv, w, b, training=True, momentum=0.3, eps=1e-5)
    y3 = F.batch_norm(x, rm, rv, w, b, training=False)
    if dev == "mncore":
        mncore.sync()
    return read_before_sync, (y, y2, y3, rm, rv, early, stats)



@pytest.mark.parametrize("stat_views,weight", [(False, True), (False, False), (True, True)],
                         ids=["plain", "no_affine", "stats_are_views"])
def test_functional_batch_norm_training_updates_running_stats(stat_views, weight):
    x = torch.randn(4, 3, 5, 5)
    ref_read, ref = _bn_stats_run("cpu", x, stat_views, weight)
    dev_read, dev = _bn_stats_run("mncore", x, stat_views, weight)
    torch.testing.assert_close(dev_read, ref_read, msg=lambda m: f"running stats read before sync: {m}")
    mncore.wait_device_ops()
    assert_same([t for t in dev if t is not None], [t for t in ref if t is not None], exact=False)


def test_functional_batch_norm_outputs():
    def f(x, rm, rv, w, b):
        y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        y2 = F.batch_norm(x, None, None, w, b, training=True)
        y3 = F.batch_norm(x * 2, rm, rv, w, b, training=False, eps=1e-3)
        return y, y2, y3

    # the running stats are compared in test_functional_batch_norm_training_updates_running_stats
    run_both(f, torch.randn(4, 3, 5, 5), torch.zeros(3), torch.ones(3), torch.rand(3) + 0.5, torch.randn(3),
             exact=False, check_inputs=False)


def _bn_module_run(m, xs, read_stats_early):
    m.train()
    ys = [m(x.to(m.weight.device)) for x in xs[:2]]
    early = (m.running_mean.detach().cpu(), m.running_var.detach().cpu()) if read_stats_early else None
    if m.weight.device.type == "mncore":
        mncore.sync()
    m.eval()
    ys.append(m(xs[2].to(m.weight.device)))
    if m.weight.device.type == "mncore":
        mncore.sync()
    return ys, early


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm2d_module_train_then_eval(momentum):
    ref = nn.BatchNorm2d(3, momentum=momentum)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    dev = copy.deepcopy(ref).to("mncore")
    xs = [torch.randn(4, 3, 6, 6) for _ in range(3)]
    ref_ys, _ = _bn_module_run(ref, xs, False)
    dev_ys, _ = _bn_module_run(dev, xs, False)
    # train outputs use batch statistics; the eval output uses the running statistics
    assert_same(dev_ys, ref_ys, exact=False)
    assert_same(dev.num_batches_tracked, ref.num_batches_tracked, path="num_batches_tracked")
    assert int(dev.num_batches_tracked) == 2



def test_batchnorm2d_module_running_stats():
    ref = nn.BatchNorm2d(3)
    dev = copy.deepcopy(ref).to("mncore")
    mncore.sync()
    xs = [torch.randn(4, 3, 6, 6) for _ in range(3)]
    _, ref_early = _bn_module_run(ref, xs, True)
    _, dev_early = _bn_module_run(dev, xs, True)
    torch.testing.assert_close(dev_early, ref_early, msg=lambda m: f"running stats read before sync: {m}")
    mncore.wait_device_ops()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert_same(getattr(dev, name), getattr(ref, name), exact=False, path=name)


def test_batchnorm2d_backward():
    ref = nn.BatchNorm2d(2)
    dev = copy.deepcopy(ref).to("mncore")
    x = torch.randn(3, 2, 4, 4)
    grads = []
    for m in (ref, dev):
        xi = x.to(m.weight.device).requires_grad_()
        y = (m(xi) * torch.arange(32.0).reshape(2, 4, 4).to(xi.device)).sum()
        grads.append(torch.autograd.grad(y, (xi, m.weight, m.bias)))
    mncore.sync()
    assert_same(grads[1], grads[0], exact=False, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# dtype promotion, scalars, 0-dim, layouts


@pytest.mark.parametrize(
    "da,db",
    [
        (torch.int64, torch.float32),
        (torch.int32, torch.float64),
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float16),
        (torch.uint8, torch.int8),
        (torch.bool, torch.int64),
        (torch.bool, torch.float32),
        (torch.int32, torch.int64),
    ],
)
def test_dtype_promotion_binary(da, db):
    def f(a, b):
        return a + b, a * b, torch.maximum(a, b), a == b, a < b

    a = torch.tensor([0, 1, 2, 3]).to(da)
    b = torch.tensor([3, 1, 0, 2]).to(db)
    run_both(f, a, b)


def test_int_division_and_bool_ops():
    def f(a, b, m, n):
        return (a / b, a // b, a % b, torch.div(a, b, rounding_mode="trunc"), m & n, m | n, m ^ n, ~m,
                torch.logical_and(m, a > 2), m.sum(), m.any(), m.all(), (a > 1).float(), -a, a.abs())

    run_both(f, torch.tensor([7, -7, 9, 4]), torch.tensor([2, 2, -4, 3]),
             torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False]))


def test_zero_dim_tensors():
    def f(s, x, si, s64):
        return (s + x, s * s, x * si, si + 1, s64 + x, (x + si).dtype == torch.float32, s.sum(), x[1],
                x[1] + s, torch.stack([s, s]), s.unsqueeze(0), si.float())

    run_both(f, torch.tensor(2.5), torch.tensor([1.0, 2.0, 3.0]), torch.tensor(3), torch.tensor(0.5, dtype=torch.float64))


def test_zero_dim_cpu_tensor_mixed_with_lazy():
    def f(x):
        return x + torch.tensor(2.0), x * torch.tensor(3), torch.where(x > 1, x, torch.tensor(0.0))

    run_both(f, torch.tensor([1.0, 2.0, 3.0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool])
def test_python_scalars(dtype):
    def f(x):
        return x * 2.5, x + 1, x - 1.5, 2 * x, 3.0 / (x + 1), x / 2, x > 1, x ** 2, x + True

    x = torch.tensor([0, 1, 2, 3]).to(dtype)
    if dtype is torch.bool:
        def f(x):  # noqa: F811 - bool tensors forbid `-` and `**`
            return x * 2.5, x + 1, 2 * x, x / 2, x & True, x | False

    run_both(f, x)


def test_changing_python_scalar_values():
    ref = _grid(2, 3)
    dev = ref.to("mncore")
    for s in (2.5, -1.0, 0.125):
        y = dev * s + s
        mncore.sync()
        assert_same(y, ref * s + s)


@pytest.mark.parametrize("layout", ["t", "step", "col_step", "expand", "permute", "neg_offset"])
def test_noncontiguous_cpu_inputs(layout):
    base = _grid(6, 4)
    src = {
        "t": base.t(),
        "step": base[::2],
        "col_step": base[1:, 1::2],
        "expand": base[0:1].expand(3, 4),
        "permute": _grid(2, 3, 4).permute(2, 0, 1),
        "neg_offset": base[2:5, 1:3],
    }[layout]
    dev = src.mncore()
    assert dev.shape == src.shape
    assert dev.is_contiguous() == src.clone().is_contiguous()
    mncore.sync()
    assert_same(dev, src)
    y = dev * 2 + 1
    s = dev.sum(0)
    row = dev[1]
    mncore.sync()
    assert_same(y, src * 2 + 1)
    assert_same(s, src.sum(0))
    assert_same(row, src[1])
    w = dev.clone()
    w[0] = -1
    ref = src.clone()
    ref[0] = -1
    mncore.sync()
    assert_same(w, ref)


def test_noncontiguous_view_raises_like_eager():
    src = _grid(3, 4).t()
    dev = src.mncore()
    with pytest.raises(RuntimeError):
        src.view(12)
    with pytest.raises(RuntimeError):
        dev.view(12)


def test_no_grad_blocks():
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(2, 3)
    res = []
    for wi, xi in ((w, x), (_to_dev(w), _to_dev(x))):
        with torch.no_grad():
            y = xi @ wi
            wi.sub_(0.1 * wi)
        assert not y.requires_grad and y.grad_fn is None
        assert wi.requires_grad and wi.is_leaf
        z = (xi @ wi).sum()
        assert z.requires_grad
        (g,) = torch.autograd.grad(z, wi)
        res.append((y, wi, z, g))
    mncore.sync()
    assert_same(res[1], res[0])


# ---------------------------------------------------------------------------------------------
# factories


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.zeros(2, 3, device=d),
        lambda d: torch.zeros((2, 3), dtype=torch.int32, device=d),
        lambda d: torch.ones(4, device=d),
        lambda d: torch.ones(2, 2, dtype=torch.bool, device=d),
        lambda d: torch.full((2, 3), 3.5, device=d),
        lambda d: torch.full((2,), 7, device=d),
        lambda d: torch.full((2,), True, device=d),
        lambda d: torch.arange(10, device=d),
        lambda d: torch.arange(1, 5, 0.5, device=d),
        lambda d: torch.arange(5, dtype=torch.float32, device=d),
        lambda d: torch.arange(-3.0, 3.0, 1.5, device=d),
        lambda d: torch.eye(3, device=d),
        lambda d: torch.eye(2, 4, dtype=torch.int64, device=d),
        lambda d: torch.empty(3, 4, device=d).fill_(2.0),
        lambda d: torch.empty(3, dtype=torch.int64, device=d).fill_(-4),
        lambda d: torch.linspace(0, 1, 7, device=d),
        lambda d: torch.linspace(-2, 2, 5, dtype=torch.float64, device=d),
        lambda d: torch.logspace(0, 2, 3, device=d),
        lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
        lambda d: torch.tensor([1.5, -2.0], dtype=torch.float64, device=d),
        lambda d: torch.tensor(3.5, device=d),
        lambda d: torch.tensor([True, False], device=d),
        lambda d: torch.as_tensor([1.0, 2.0], device=d),
        lambda d: torch.zeros_like(torch.ones(2, 3).to(d)),
        lambda d: torch.full_like(torch.ones(2, 3, dtype=torch.int32).to(d), 5),
        lambda d: torch.ones(2, 3, device=d).new_zeros(4),
        lambda d: torch.ones(2, 3, device=d).new_full((2,), 1.5),
        lambda d: torch.tril_indices(3, 3, device=d),
        lambda d: torch.scalar_tensor(2.0, device=d),
    ],
)
def test_factories(make):
    ref = make("cpu")
    dev = make("mncore")
    assert dev.device.type == "mncore"
    mncore.sync()
    assert_same(dev, ref)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.randn(2, 3, device=d),
        lambda d: torch.rand(4, dtype=torch.float64, device=d),
        lambda d: torch.randint(0, 5, (3, 2), device=d),
        lambda d: torch.randperm(6, device=d),
        lambda d: torch.randn_like(torch.zeros(2, 2).to(d)),
        lambda d: torch.empty(5, device=d).uniform_(-1, 1),
        lambda d: torch.empty(5, device=d).normal_(),
    ],
)
def test_random_factories_shape_and_dtype(make):
    ref = make("cpu")
    dev = make("mncore")
    mncore.sync()
    assert dev.device.type == "mncore"
    assert dev.shape == ref.shape and dev.dtype == ref.dtype
    host = dev.cpu()
    assert torch.isfinite(host.double()).all()


def test_random_reproducible_with_manual_seed():
    torch.manual_seed(123)
    a = torch.randn(8, device="mncore")
    torch.manual_seed(123)
    b = torch.randn(8, device="mncore")
    c = torch.randn(8, device="mncore")
    mncore.sync()
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(b.cpu(), c.cpu())


def test_randperm_is_a_permutation():
    p = torch.randperm(10, device="mncore")
    mncore.sync()
    assert sorted(p.cpu().tolist()) == list(range(10))


# ---------------------------------------------------------------------------------------------
# reductions, shape ops, indexing ops


def test_reductions():
    def f(x, xi, m):
        mx = x.max(dim=1)
        mn = torch.min(x, 0, keepdim=True)
        return (x.sum(), x.sum(1), x.sum((0, 1), keepdim=True), x.mean(), x.mean(0, dtype=torch.float64),
                x.prod(1), x.max(), tuple(mx), tuple(mn), x.argmax(), x.argmax(1), x.argmin(0), x.amax((0, 1)),
                x.std(), x.var(1, correction=0), x.norm(), torch.logsumexp(x, 1), x.cumsum(1), xi.sum(),
                xi.sum().dtype == torch.int64, xi.prod(0), m.sum(), m.any(1), m.all(), torch.count_nonzero(m, 1),
                x.median(), xi.float().mean(1))

    x = torch.randn(4, 5)
    xi = torch.randint(-3, 4, (4, 5), dtype=torch.int32)
    run_both(f, x, xi, x > 0, exact=False)


def test_empty_reductions():
    def f(e):
        return e.sum(), e.sum(0), e.prod(), e.any(), e.mean(1)

    run_both(f, torch.zeros(0, 3))


def test_cat_stack():
    def f(a, b, c, i, e):
        return (torch.cat([a, b], dim=1), torch.cat([a, c]), torch.cat([a, i], 0), torch.cat([a, e], 0),
                torch.stack([a, c]), torch.stack([a, c], dim=-1), torch.hstack([a, b]), torch.vstack([a, c]),
                torch.cat([a[:, 1:], b[:, :2]], 1))

    run_both(f, _grid(2, 3), -_grid(2, 2), _grid(2, 3) + 100, torch.ones(1, 3, dtype=torch.int64),
             torch.zeros(0, 3))


def test_where():
    def f(c, a, b, i):
        return (torch.where(c, a, b), torch.where(c, a, 0.0), torch.where(c, 1.0, b), torch.where(c, a, i),
                torch.where(a > 2, a, b).sum(), a.where(c, b))

    c = torch.tensor([[True, False, True], [False, False, True]])
    run_both(f, c, _grid(2, 3), -_grid(2, 3), torch.tensor([7, 8, 9]))


def test_gather_scatter():
    def f(x, idx, src, y):
        g = torch.gather(x, 1, idx)
        s = torch.scatter(x, 1, idx[:, :1], src[:, :1])
        y.scatter_(0, torch.tensor([[1, 0, 2]], device=y.device), -1.0)
        a = torch.zeros(3, 4, device=x.device).scatter_add_(1, idx, src)
        r = torch.zeros(3, 4, device=x.device).scatter_reduce(1, idx, src, reduce="amax", include_self=False)
        isel = torch.index_select(x, 0, torch.tensor([2, 0], device=x.device))
        iadd = torch.zeros(4, 4, device=x.device).index_add_(0, torch.tensor([1, 3, 1], device=x.device), x)
        return g, s, y, a, r, isel, iadd

    idx = torch.tensor([[0, 1, 1], [3, 2, 0], [2, 2, 2]])
    run_both(f, _grid(3, 4), idx, _grid(3, 3) + 1, _grid(3, 3))


def test_advanced_indexing_read():
    def f(x, i, j):
        return x[i], x[i, j], x[:, j], x[..., 1], x[None, 1:, ::2], x[i][:, 0], x[[0, 2]], x[-1, -2]

    run_both(f, _grid(3, 4), torch.tensor([2, 0, 2]), torch.tensor([1, 3, 0]))


def test_cpu_indices_index_a_device_tensor_as_in_eager():
    """Advanced indexing takes CPU index tensors for a device tensor (eager moves them, as for CUDA:
    BEiT's relative position table is indexed by a CPU index built in forward); reads, writes,
    accumulation and the gradient match eager CPU, while ops that are not indexing still refuse."""
    idx, rows = torch.tensor([4, 0, 2, 2]), torch.tensor([1, 3])
    w = torch.randn(5, 3, requires_grad=True)
    ref = w[idx] * 2
    ref.sum().backward()
    wd = w.detach().to("mncore").requires_grad_()
    got = wd[idx] * 2  # idx stays on the CPU
    got.sum().backward()
    mncore.sync()
    assert_same(got, ref)
    assert_same(wd.grad, w.grad)
    for accumulate in (False, True):
        x, xd = _grid(5, 3), _grid(5, 3).to("mncore")
        for t, v in ((x, torch.ones(2, 3)), (xd, torch.ones(2, 3).to("mncore"))):
            t.index_put_((rows,), v, accumulate=accumulate)
            t[idx, 1] = -1.0
        mncore.sync()
        assert_same(xd, x)
    with pytest.raises(RuntimeError, match="same device"):
        torch.index_select(_grid(5, 3).to("mncore"), 0, idx)


def test_embedding():
    w = torch.randn(10, 4)
    idx = torch.tensor([[1, 2, 0], [9, 2, 2]])

    def f(w, idx):
        return F.embedding(idx, w), F.embedding(idx, w, padding_idx=2), w[idx].sum()

    run_both(f, w, idx)

    ref = nn.Embedding(10, 4, padding_idx=0)
    dev = copy.deepcopy(ref).to("mncore")
    grads = []
    for m in (ref, dev):
        out = m(idx.to(m.weight.device))
        (g,) = torch.autograd.grad((out * out).sum(), m.weight)
        grads.append((out, g))
    mncore.sync()
    assert_same(grads[1], grads[0])


def test_softmax_log_softmax():
    def f(x):
        return (torch.softmax(x, -1), torch.softmax(x, 0), F.log_softmax(x, dim=1), x.softmax(1, dtype=torch.float64),
                F.softmax(x.half(), -1), torch.log_softmax(x[:, :2], 0))

    run_both(f, torch.randn(3, 5), exact=False)


def test_matmul_bmm_einsum():
    def f(a, b, v, ba, bb):
        return (a @ b, torch.matmul(a, v * 0 + 1), v @ v, v @ ba.transpose(1, 2), torch.bmm(ba, bb), torch.matmul(ba, b),
                torch.einsum("bij,bjk->bik", ba, bb), torch.einsum("ii->i", a[:3, :3]), torch.einsum("ij->", a),
                torch.einsum("i,j->ij", v, v), torch.mm(a, b), a.t() @ a, torch.addmm(b[0, :1], a, b[:, :1]))

    run_both(f, torch.randn(5, 3), torch.randn(3, 4), torch.randn(3), torch.randn(2, 5, 3), torch.randn(2, 3, 6),
             exact=False)


def test_matmul_vector_matrix():
    def f(v, w):
        return v @ w, torch.matmul(v, w), F.linear(v, w.t())

    run_both(f, torch.randn(3), torch.randn(3, 4), exact=False)


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 1}, {"dilation": 2}, {"groups": 2, "padding": "same"}])
def test_conv2d(kw):
    groups = kw.get("groups", 1)

    def f(x, w, b):
        return F.conv2d(x, w, b, **kw), F.conv2d(x, w, None, **kw)

    run_both(f, torch.randn(2, 4, 7, 7), torch.randn(6, 4 // groups, 3, 3), torch.randn(6), exact=False)


def test_conv2d_module_and_pooling():
    def f(x):
        return (F.max_pool2d(x, 2), F.max_pool2d(x, 3, stride=2, padding=1), F.max_pool2d(x, 2, return_indices=True),
                F.avg_pool2d(x, 2), F.adaptive_avg_pool2d(x, 1), F.max_pool2d(x, (2, 3), ceil_mode=True))

    run_both(f, torch.randn(2, 3, 7, 6))


def test_layer_norm():
    def f(x, w, b):
        return (F.layer_norm(x, (6,), w, b), F.layer_norm(x, (5, 6)), F.layer_norm(x, (6,), w, b, eps=1e-2),
                F.group_norm(x.transpose(1, 2), 2))

    run_both(f, torch.randn(3, 5, 6), torch.randn(6), torch.randn(6), exact=False)


def test_elementwise_unary_and_misc():
    def f(x):
        return (x.exp(), x.sin(), torch.tanh(x), torch.sigmoid(x), F.relu(x), F.gelu(x), x.abs().sqrt(), x.floor(),
                x.round(), torch.clamp(x, -0.5, 0.5), x.sign(), torch.nan_to_num(x / 0), x.isnan(), F.silu(x),
                torch.erf(x), x.pow(3), x.reciprocal(), x.flip(0), x.roll(1, 1), x.tril(), torch.sort(x, 1),
                torch.topk(x, 2))

    run_both(f, torch.randn(4, 5), exact=False)


def test_autograd_grad_composite():
    def f(x, w, b, t):
        h = torch.tanh(x @ w + b)
        p = F.log_softmax(h, -1)
        loss = F.nll_loss(p, t) + (h ** 2).mean() + h[:, 0].sum() * 0.5 + F.mse_loss(h, torch.zeros_like(h))
        return torch.autograd.grad(loss, (x, w, b))

    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    run_both(f, x, w, b, torch.tensor([0, 4, 2, 1]), exact=False, check_inputs=False)


def test_autograd_through_views_and_inplace():
    def f(x):
        y = x.clone()
        y[1:] *= 2
        y.t()[0].add_(1)
        z = y.view(-1)[::2].sin()
        return torch.autograd.grad(z.sum() + y.pow(2).sum(), x)

    run_both(f, torch.randn(3, 4, requires_grad=True), exact=False, check_inputs=False)


def test_backward_accumulates_into_grad():
    ref = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    dev = copy.deepcopy(ref).to("mncore")
    x = torch.randn(5, 3)
    for m in (ref, dev):
        for _ in range(2):
            m(x.to(next(m.parameters()).device)).pow(2).sum().backward()
    mncore.sync()
    for (n, p_ref), p_dev in zip(ref.named_parameters(), dev.parameters()):
        assert p_dev.grad is not None and p_dev.grad.device.type == "mncore", n
        assert_same(p_dev.grad, p_ref.grad, exact=False, path=n)


# ---------------------------------------------------------------------------------------------
# host side


def test_item_tolist_bool_float():
    ref = torch.tensor([[1.5, -2.0], [0.0, 4.0]])
    dev = ref.to("mncore")
    y = dev * 2
    assert y.sum().item() == (ref * 2).sum().item()
    assert y.tolist() == (ref * 2).tolist()
    assert dev[0, 0].item() == 1.5
    assert isinstance(dev.long()[0, 1].item(), int)
    assert bool(dev[0, 0]) is True and bool(dev[1, 0]) is False
    assert float(dev[0, 1]) == -2.0
    assert int(dev[1, 1]) == 4
    assert (dev > 0).any().item() is True
    assert torch.tensor(3, device="mncore").tolist() == 3
    with pytest.raises(RuntimeError):
        bool(dev)  # ambiguous, like eager
    if dev[1, 1] > 3:
        pass
    else:
        pytest.fail("if-statement on a 0-dim comparison gave the wrong branch")


def test_repr_and_print(capsys):
    ref = torch.tensor([1.0, 2.5, -3.0])
    dev = ref.to("mncore") * 1
    r = repr(dev)
    assert "device='mncore:0'" in r
    assert repr(ref)[:-1] in r
    print(dev)
    printed = capsys.readouterr().out
    assert "mncore:0" in printed and "2.5000" in printed
    ri = repr(torch.tensor([1, 2], dtype=torch.int32).to("mncore"))
    assert "mncore:0" in ri and "int32" in ri and "[1, 2]" in ri
    rg = repr(torch.ones(2, requires_grad=True).to("mncore"))
    assert "mncore:0" in rg and "grad" in rg
    assert "mncore:0" in repr(dev[1]) and "2.5000" in repr(dev[1])
    assert "mncore:0" in str(torch.zeros(0, 3, device="mncore"))


def test_numpy():
    dev = _grid(2, 3).to("mncore")
    with pytest.raises(TypeError):
        dev.numpy()
    a = (dev * 2).cpu().numpy()
    assert a.shape == (2, 3) and a.tolist() == (_grid(2, 3) * 2).tolist()


def test_torch_equal():
    a = _grid(2, 3)
    da = a.to("mncore")
    assert torch.equal(da, da * 1)
    assert not torch.equal(da, da + 1)
    assert torch.equal(da.t(), a.t().to("mncore"))
    assert not torch.equal(da, da.reshape(3, 2))
    assert torch.equal(da, a.to("mncore"))


def test_format_zero_dim():
    ref = torch.tensor(2.34567)
    dev = ref.to("mncore") * 1
    mncore.sync()
    assert format(dev, "") == format(ref, "")  # 0-dim tensors format their value, as eager (and CUDA) do
    assert format(dev, ".3f") == format(ref, ".3f")
    assert f"{dev:.2f}" == "2.35"


def test_inference_mode():
    ref = nn.Linear(3, 2)
    dev = copy.deepcopy(ref).to("mncore")
    x = torch.randn(4, 3)
    outs = []
    for m in (ref, dev):
        with torch.inference_mode():
            y = torch.relu(m(x.to(m.weight.device))) * 2
            inside = y.argmax(1).cpu()  # the usual eval-loop read
        outs.append((y, inside, y.cpu()))
    mncore.sync()
    assert_same(outs[1][0], outs[0][0], exact=False)
    torch.testing.assert_close(outs[1][1], outs[0][1], rtol=0, atol=0)
    torch.testing.assert_close(outs[1][2], outs[0][2])


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: torch.cat([x, x.t()]), id="cat_shape"),
        pytest.param(lambda x: x @ x, id="mm_shape"),
        pytest.param(lambda x: x + x[:2], id="broadcast"),
        pytest.param(lambda x: x.long().add_(1.5), id="inplace_cast"),
        pytest.param(lambda x: x.long().mean(), id="mean_int"),
        pytest.param(lambda x: (x > 1) - (x > 2), id="bool_sub"),
        pytest.param(lambda x: x[0].add_(x), id="inplace_broadcast"),
        pytest.param(lambda x: x.view(5, 5), id="view_numel"),
        pytest.param(lambda x: x[7], id="index_out_of_range"),
    ],
)
def test_errors_raise_like_eager(fn):
    x = _grid(3, 4)
    with pytest.raises((RuntimeError, NotImplementedError, IndexError)) as ref:
        fn(x.clone())
    with pytest.raises((RuntimeError, NotImplementedError, IndexError)) as dev:
        fn(x.to("mncore"))  # raised while tracing, not deferred to sync
    assert type(dev.value) is type(ref.value)


def test_implicit_sync_warning_and_error_modes():
    mncore.init_cpu(implicit_sync="warn")
    x = torch.ones(3).to("mncore") * 2
    with pytest.warns(mncore.ImplicitSyncWarning):
        assert x.sum().item() == 6.0
    mncore.sync()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing pending: reading must not warn
        assert x.tolist() == [2.0, 2.0, 2.0]
        assert x[1].item() == 2.0
    mncore.init_cpu(implicit_sync="error")
    y = x + 1
    with pytest.raises(mncore.ImplicitSyncError):
        y.cpu()
    mncore.sync()
    assert y.cpu().tolist() == [3.0, 3.0, 3.0]
    before = mncore.metrics.counters()["implicit_syncs"]
    assert y.tolist() == [3.0, 3.0, 3.0]
    assert mncore.metrics.counters()["implicit_syncs"] == before


# ---------------------------------------------------------------------------------------------
# model identity


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1 = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 4, bias=False)
        self.lin2.weight = self.lin1.weight
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.lin2(torch.relu(self.bn(self.lin1(x))))


def test_model_to_keeps_parameter_identity_and_ties():
    model = _Tied()
    ids = {n: id(p) for n, p in model.named_parameters(remove_duplicate=False)}
    params = list(model.parameters())
    ret = model.to("mncore")
    assert ret is model
    assert {n: id(p) for n, p in model.named_parameters(remove_duplicate=False)} == ids
    assert model.lin2.weight is model.lin1.weight
    assert len(list(model.parameters())) == len(params) == 4  # lin1.w/b, bn.w/b
    for p in model.parameters():
        assert isinstance(p, nn.Parameter) and p.device.type == "mncore" and p.requires_grad
    for b in model.buffers():
        assert b.device.type == "mncore"
    assert next(model.parameters()).device.type == "mncore"


def test_model_mncore_method_and_training_matches_eager():
    ref = _Tied()
    dev = copy.deepcopy(ref)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1, momentum=0.9)  # created before the move
    assert dev.mncore() is dev
    assert next(dev.parameters()).device.type == "mncore"
    assert dev.lin2.weight is dev.lin1.weight
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    xs = [torch.randn(6, 4) for _ in range(3)]
    for m, opt in ((ref, opt_ref), (dev, opt_dev)):
        for x in xs:
            opt.zero_grad()
            m(x.to(next(m.parameters()).device)).pow(2).mean().backward()
            opt.step()
            if m is dev:
                mncore.sync()
    assert_same(dict(dev.state_dict()), dict(ref.state_dict()), exact=False, rtol=1e-5, atol=1e-6)
    assert dev.lin2.weight is dev.lin1.weight


def test_model_keeps_parameter_identity_off_the_device_and_back():
    """``.cpu()``, ``.double()`` and ``.to("mncore")`` of a model on the device swap each parameter (and
    its ``.grad``) in place, so the optimizer made before the first move keeps training it (plain SGD:
    optimizer state does not move with the model, in PyTorch either)."""
    ref = _Tied()
    dev = copy.deepcopy(ref)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=0.1)
    params = list(dev.parameters())
    xs = [torch.randn(6, 4, dtype=torch.float64) for _ in range(3)]
    ref.double()
    for m, opt, moves in ((ref, opt_ref, [None] * 3), (dev, opt_dev, ["mncore", "cpu", "mncore"])):
        for x, where in zip(xs, moves):
            if where is not None:
                m.to(where, torch.float64)
                mncore.sync()
            opt.zero_grad(set_to_none=False)  # keep .grad, so that the moves carry it too
            m(x.to(next(m.parameters()).device)).pow(2).mean().backward()
            opt.step()
            mncore.sync()
    assert list(dev.parameters()) == params and dev.lin2.weight is dev.lin1.weight
    assert all(p.device.type == "mncore" and p.dtype == torch.float64 for p in params)
    assert all(p.grad is not None and p.grad.device.type == "mncore" for p in params)
    assert_same(dict(dev.state_dict()), dict(ref.state_dict()), exact=False, rtol=1e-12, atol=1e-12)


def test_model_with_view_gradients_converts_on_the_device():
    """A ``Linear`` weight's ``.grad`` is a transposed view; reading it cached its traced value in a list
    the tracer held weakly, and ``swap_tensors`` refuses a tensor with a weak reference, so ``.double()``
    of a trained model on the device failed with "Couldn't swap Linear.weight.grad"."""
    ref = nn.Linear(4, 3).double()
    dev = copy.deepcopy(ref).float().to("mncore")
    x = torch.randn(5, 4, dtype=torch.float64)
    dev(x.float().mncore()).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    mncore.sync()
    grad = dev.weight.grad
    dev.double()  # reads every .grad (a view) through the tracer, then swaps it
    assert dev.weight.grad is grad and grad.dtype == torch.float64 and grad.device.type == "mncore"
    torch.testing.assert_close(grad.cpu(), ref.weight.grad, rtol=1e-5, atol=1e-5)  # float32 gradients, widened


def test_state_dict_roundtrip():
    ref = nn.Linear(3, 2)
    dev = copy.deepcopy(ref).mncore()
    sd = {k: v.cpu() for k, v in dev.state_dict().items()}
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(sd[k], v, rtol=0, atol=0)
    new = nn.Linear(3, 2).mncore()
    new.load_state_dict(ref.state_dict())
    mncore.sync()
    assert_same(dict(new.state_dict()), dict(ref.state_dict()))
    assert new.weight.device.type == "mncore"


# ---------------------------------------------------------------------------------------------
# data-dependent shapes fall back to eager


def _fallbacks():
    return mncore.metrics.counters()["fallback_ops"]


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: x[x > 0], id="bool_mask_index"),
        pytest.param(lambda x: torch.nonzero(x), id="nonzero"),
        pytest.param(lambda x: x.nonzero(as_tuple=True), id="nonzero_tuple"),
        pytest.param(lambda x: torch.unique(x), id="unique"),
        pytest.param(lambda x: torch.unique(x, return_inverse=True, return_counts=True), id="unique_counts"),
        pytest.param(lambda x: torch.masked_select(x, x < 1), id="masked_select"),
    ],
)
def test_data_dependent_fallback(fn):
    x = torch.tensor([[1.0, -2.0, 0.0], [3.0, 1.0, -2.0]])
    before = _fallbacks()
    out, _ = run_both(lambda t: fn(t * 1), x, allow_implicit_sync=True)
    assert _fallbacks() > before


def test_fallback_result_feeds_lazy_ops():
    def f(x):
        pos = x[x > 0]
        y = pos * 2 + pos.sum()
        x.add_(1)  # later writes don't affect the fallback's result
        return y, pos, x

    run_both(f, torch.tensor([1.0, -2.0, 0.0, 3.0]), allow_implicit_sync=True)


@pytest.mark.parametrize("stride", [(12, 4, 2, 1), (12, 1, 6, 3), (1, 2, 6, 12), (6, 2, 1, 1)])
def test_as_strided_inplace_same_shape_reads_storage_like_eager(stride):
    """Found by `harness fuzz`: restriding in place must re-read the storage as eager does."""
    x = torch.arange(24.0).reshape(2, 3, 2, 2)
    got = x.clone().mncore().as_strided_(x.shape, stride)
    assert torch.equal(got.cpu(), x.clone().as_strided_(x.shape, stride))


def test_as_strided_inplace_out_of_bounds_raises_like_eager():
    x = torch.arange(24.0).reshape(2, 3, 2, 2)
    with pytest.raises(RuntimeError):
        x.clone().as_strided_(x.shape, (24, 4, 2, 1))
    with pytest.raises(RuntimeError, match="out of bounds"):
        x.clone().mncore().as_strided_(x.shape, (24, 4, 2, 1))
