"""Step capture (``mncore.capture``): regression tests for what a call key, a guard or a refusal must cover.

Each test is one reviewer reproduction turned around: the captured step against the same step run
uncaptured in lazy mode (bit-identical on pfvm:cpu, same seeds), plus the ``CaptureWarning``s it must
(or must not) give and the ``replays``/``captures`` counters, so a pass proves which calls replayed.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mncore
from tests.helpers import capture_warning_messages as _capture_warnings
from tests.helpers import counter_delta as _delta
from tests.helpers import cpu_copy as _cpu

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_capture_check")]




# ---------------------------------------------------------------------------------------------- helpers








def _call(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, bool]:
    """``fn(*args, **kwargs)`` and whether that call was a replay."""
    before = mncore.metrics.counters()["replays"]
    out = fn(*args, **kwargs)
    return out, mncore.metrics.counters()["replays"] == before + 1


def _linear_problem() -> tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]:
    """A Linear(4, 3) classifier and a batch of 6, from seed 0 (each test copies the model)."""
    torch.manual_seed(0)
    base = torch.nn.Linear(4, 3)
    return base, torch.randn(6, 4), torch.randint(0, 3, (6,))


def _equal_lists(a: list, b: list) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (i, x, y)
        assert torch.equal(x, y), (i, x, y)


class _Warns:
    """Records every warning of the block; ``.capture`` lists the CaptureWarning messages."""

    def __enter__(self) -> "_Warns":
        self._cm = warnings.catch_warnings(record=True)
        self.rec = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    @property
    def capture(self) -> list[str]:
        return _capture_warnings(self.rec)


def _sgd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, set_to_none: bool = True) -> Callable:
    def step(x, y):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


# ---------------------------------------------------------------------------------------------- 1. conversions


@pytest.mark.parametrize("what", ["to_mncore", "double", "load_state_dict", "load_state_dict_assign"])
def test_module_conversion_after_a_captured_call_works_as_in_lazy_mode(what: str):
    """15_swap_weakref: capture's references to the parameters must not block ``swap_tensors``."""
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2).mncore()
    x = torch.randn(4, 3).mncore()

    def f(inp):
        with torch.no_grad():
            return m(inp)

    cf = mncore.capture(f)
    for _ in range(3):
        out = cf(x)
        assert torch.equal(out.cpu(), f(x).cpu())
    sd = {k: v.detach() * 2 + 1 for k, v in m.state_dict().items()}  # new values; the caller keeps them
    want = {k: _cpu(v) for k, v in sd.items()}
    if what == "to_mncore":
        m.to("mncore")
    elif what == "double":
        m.double()
        assert m.weight.dtype == torch.float64
    elif what == "load_state_dict":
        m.load_state_dict(sd)
    else:
        m.load_state_dict(sd, assign=True)
    if what.startswith("load_state_dict"):
        for k, v in m.state_dict().items():
            assert torch.equal(v.cpu(), want[k]), k
    xs = x.to(m.weight.dtype)
    replayed = []
    for _ in range(4):
        out, r = _call(cf, xs)
        replayed.append(r)
        ref = f(xs)
        mncore.sync()
        assert out.dtype == ref.dtype and torch.equal(out.cpu(), ref.cpu())
    assert replayed[-1]  # capture keeps working after the conversion
    del sd


def test_load_state_dict_and_reseed_between_captured_training_calls_match_lazy():
    """19_load_state_seed: checkpoint at call 3, restore model and optimizer and reseed at call 5."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3))
    xs = [torch.randn(6, 4) for _ in range(8)]
    ys = [torch.randint(0, 3, (6,)) for _ in range(8)]

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step = _sgd_step(model, opt)
        fn = mncore.capture(step) if captured else step
        torch.manual_seed(7)
        losses, replayed, ck = [], [], None
        for i in range(8):
            if i == 3:
                ck = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
            if i == 5:
                model.load_state_dict(ck[0])
                opt.load_state_dict(ck[1])
                torch.manual_seed(42)
            loss, r = _call(fn, xs[i].mncore(), ys[i].mncore())
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        params = [_cpu(p) for p in model.parameters()]
        momenta = [_cpu(v["momentum_buffer"]) for v in opt.state.values()]
        return losses, params, momenta, replayed

    cap = run(True)
    lazy = run(False)
    for a, b in zip(cap[:3], lazy[:3]):
        _equal_lists(a, b)
    assert not any(lazy[3])
    assert any(cap[3])


# ---------------------------------------------------------------------------------------------- 2. requires_grad


@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
def test_freezing_a_parameter_between_calls_stops_training_it(set_to_none: bool):
    """03_freeze: ``requires_grad_(False)`` after the step replays; the frozen weight must stay put."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = _sgd_step(model, opt, set_to_none)
        fn = mncore.capture(step) if captured else step
        xd, yd = x.mncore(), y.mncore()
        losses, replayed = [], []
        for i in range(7):
            if i == 4:
                model[0].weight.requires_grad_(False)
                frozen = _cpu(model[0].weight)
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        assert torch.equal(model[0].weight.cpu(), frozen)
        return losses, [_cpu(p) for p in model.parameters()], replayed

    cap = run(True)
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert cap[2][3]  # replaying before the freeze
    assert not cap[2][4]  # the freeze is a new key: recorded


def test_unfreezing_a_parameter_between_calls_starts_training_it():
    """03b_unfreeze: a backbone frozen at first, unfrozen after the step replays."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x, y = torch.randn(6, 4), torch.randint(0, 2, (6,))

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        model[0].requires_grad_(False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        step = _sgd_step(model, opt)
        fn = mncore.capture(step) if captured else step
        xd, yd = x.mncore(), y.mncore()
        losses, replayed = [], []
        for i in range(8):
            if i == 4:
                model[0].requires_grad_(True)
                w = _cpu(model[0].weight)
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        assert not torch.equal(model[0].weight.cpu(), w)  # it trains again
        return losses, [_cpu(p) for p in model.parameters()], replayed

    cap = run(True)
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert cap[2][3] and not cap[2][4]
    assert cap[2][-1]  # the unfrozen key replays too


# ---------------------------------------------------------------------------------------------- 3. leaf .grad


def test_leaf_argument_requiring_grad_gets_its_grad_on_replay():
    """17_arg_grad: ``backward()`` into a new leaf argument every call."""
    def f(x):
        loss = (x * x).sum()
        loss.backward()
        return loss

    def run(fn):
        out = []
        for i in range(5):
            x = torch.full((3,), float(i) + 0.5).mncore().requires_grad_()
            loss, r = _call(fn, x)
            mncore.sync()
            assert x.grad is not None, i
            out.append((_cpu(loss), _cpu(x.grad), r))
        return out

    cap = run(mncore.capture(f))
    lazy = run(f)
    for i, ((l1, g1, _), (l2, g2, _)) in enumerate(zip(cap, lazy)):
        assert torch.equal(l1, l2), i
        assert torch.equal(g1, g2), i
        torch.testing.assert_close(g1, torch.full((3,), 2 * (i + 0.5)))
    assert cap[-1][2] and cap[-2][2]  # those calls replayed


def test_raw_parameter_reached_through_a_closure_gets_its_grad_on_replay():
    """21_raw_param_grad: a raw ``nn.Parameter`` used functionally, the optimizer outside the step."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))

    def run(captured: bool):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(3, 4).mncore())
        opt = torch.optim.SGD([w], lr=0.1)

        def micro(x, y):
            loss = F.cross_entropy(F.linear(x, w), y)
            loss.backward()
            return loss

        fn = mncore.capture(micro) if captured else micro
        xd, yd = x.mncore(), y.mncore()
        losses, grads, replayed = [], [], []
        for _ in range(6):
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            assert w.grad is not None
            losses.append(_cpu(loss))
            grads.append(_cpu(w.grad))
            replayed.append(r)
            opt.step()
            opt.zero_grad()
            mncore.sync()
        return losses, grads, [_cpu(w)], replayed

    cap = run(True)
    lazy = run(False)
    for a, b in zip(cap[:3], lazy[:3]):
        _equal_lists(a, b)
    assert len({float(l) for l in cap[0]}) == 6  # the optimizer outside really trained w
    assert cap[3][-1]


# ---------------------------------------------------------------------------------------------- 4. in-place arg


def test_in_place_op_on_an_argument_writes_the_argument_passed_now():
    """02_inplace_arg: recorded with ``x``, replayed with ``y`` while ``x`` is alive."""
    def f(t):
        t.add_(1)
        return t * 2

    cf = mncore.capture(f)
    x = torch.zeros(3).mncore()
    for _ in range(3):
        cf(x)
    y = torch.zeros(3).mncore()
    got = []
    for _ in range(3):
        out, r = _call(cf, y)
        mncore.sync()
        assert r  # same key: replays
        got.append(_cpu(out))
    assert x.cpu().tolist() == [3.0, 3.0, 3.0]  # the recorded argument is untouched
    x2, y2 = torch.zeros(3).mncore(), torch.zeros(3).mncore()
    for _ in range(3):
        f(x2)
    want = [_cpu(f(y2)) for _ in range(3)]
    mncore.sync()
    _equal_lists(got, want)
    assert torch.equal(y.cpu(), y2.cpu()) and y.cpu().tolist() == [3.0, 3.0, 3.0]
    assert torch.equal(x.cpu(), x2.cpu())


@pytest.mark.parametrize("change", ["transpose_", "resize_", "out_of_another_shape"])
def test_changing_an_arguments_shape_in_place_is_refused_and_each_call_is_right(change: str):
    """Found by the fuzzer's capture oracle: a replay wrote the values of ``x.transpose_(0, 1)`` or of an
    ``out=`` tensor eager resizes, but left the tensor passed in its old shape (each call passes a new
    one). Capture now refuses such a step, naming the argument, and every call is traced as lazy mode."""
    def f(x, out):
        if change == "transpose_":
            x.transpose_(0, 1)
        elif change == "resize_":
            x.resize_(3, 2)
        else:
            torch.mul(x, 2, out=out)
        return x * 1, out

    cf = mncore.capture(f)
    changed = 1 if change == "out_of_another_shape" else 0
    for k in range(4):
        host_x, host_out = torch.arange(6.0).reshape(2, 3) + k, torch.empty(0)
        x, out = host_x.to("mncore"), host_out.to("mncore")
        with _Warns() as w:
            got, replayed = _call(cf, x, out)
        mncore.sync()
        want = f(host_x, host_out)  # eager, on the host copies: they change as the arguments must
        assert not replayed
        assert len(w.capture) == (k == 0) and all(f"it changes argument {changed} in place" in m for m in w.capture)
        for g, e in zip((*got, x, out), (*want, host_x, host_out)):
            assert g.shape == e.shape and torch.equal(g.cpu(), e), (k, g, e)


@pytest.mark.parametrize("name", ["SGD", "Adagrad", "Adam", "AdamW"])
def test_fused_optimizer_steps_replay_like_lazy_mode(name: str):
    """``SGD(fused=True)`` and ``Adagrad(fused=True)`` ran eagerly (PyTorch has no shape function for them),
    so capture refused every such step; with a tensor ``lr`` so did Adam and AdamW. Each is a graph node now:
    the step replays, bit-identical to lazy mode."""
    base, x, y = _linear_problem()

    def run(captured: bool) -> tuple[list, list]:
        model = copy.deepcopy(base).to("mncore")
        opt = getattr(torch.optim, name)(model.parameters(), lr=torch.tensor(0.05), fused=True)
        step = _sgd_step(model, opt)
        fn = mncore.capture(step) if captured else step
        losses, replays = [], []
        for k in range(5):
            with _Warns() as w:
                loss, replayed = _call(fn, x.mncore() * (1 + k), y.mncore())
            mncore.sync()
            assert w.capture == []
            losses.append(_cpu(loss))
            replays.append(replayed)
        return losses + [_cpu(p) for p in model.parameters()], replays

    (cap, replays), (lazy, _) = run(True), run(False)
    # two recordings, or three where the first step differs (SGD's is_first_step flag)
    assert replays[:2] == [False, False] and replays[3:] == [True, True], replays
    _equal_lists(cap, lazy)


# ---------------------------------------------------------------------------------------------- 5. host preprocess


def test_host_tensor_made_inside_the_step_is_refused_even_after_equal_warm_up_calls():
    """10_host_preprocess_const: ``img.float().div(255).to("mncore")`` inside the step."""
    def f(img):
        x = img.float().div(255).to("mncore")
        return x.sum() + x * 2

    cf = mncore.capture(f)
    warm = torch.full((4,), 255, dtype=torch.uint8)
    imgs = [warm, warm] + [torch.full((4,), v, dtype=torch.uint8) for v in (0, 51, 102, 153)]
    before = mncore.metrics.counters()
    with _Warns() as w:
        got = [_cpu(cf(img)) for img in imgs]
    d = _delta(before, "replays", "captures")
    want = [_cpu(f(img)) for img in imgs]
    _equal_lists(got, want)
    assert d["replays"] == 0  # the step keeps being traced
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "host tensor" in msgs[0], msgs[0]


# ---------------------------------------------------------------------------------------------- 6. nested


@pytest.mark.parametrize("case", ["values", "random", "state_before_inner"])
def test_captured_function_called_inside_a_recording_one_runs_plainly(case: str):
    """04_nested, 04b_nested_values, 04c_nested_drop."""
    def run(captured: bool):
        state = torch.zeros(4).mncore()

        def inner_fn(x):
            return x + 1

        inner = mncore.capture(inner_fn) if captured else inner_fn

        def outer_fn(x):
            if case == "state_before_inner":
                state.add_(1)  # written before the inner captured call
            b = inner(x * 3)
            out = b * 2
            if case == "random":
                out = out + torch.rand(4, device="mncore")
            elif case == "state_before_inner":
                out = out * state
            return out

        outer = mncore.capture(outer_fn) if captured else outer_fn
        torch.manual_seed(11)
        outs, replayed = [], []
        for i in range(6):
            out, r = _call(outer, torch.full((4,), float(i)).mncore())
            mncore.sync()
            outs.append(_cpu(out))
            replayed.append(r)
        alone = inner(torch.ones(4).mncore())  # the inner captured function still works on its own
        return outs, _cpu(state), _cpu(alone), replayed

    with _Warns() as w:
        cap = run(True)
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    assert torch.equal(cap[1], lazy[1])
    assert cap[2].tolist() == [2.0] * 4
    if case == "state_before_inner":
        assert cap[1].tolist() == [6.0] * 4
    if case != "random":
        assert [o[0].item() for o in cap[0]] == [
            (i * 3 + 1) * 2.0 * (i + 1 if case == "state_before_inner" else 1) for i in range(6)]
    assert cap[3][-1]  # the outer step replays
    assert w.capture == []


# ---------------------------------------------------------------------------------------------- 7. aliasing


def test_aliasing_between_arguments_is_part_of_the_key():
    """01_alias_args: recorded as f(a, a), then called as f(a, b)."""
    def f(x, y):
        return x * 2 + y

    cf = mncore.capture(f)
    a, b = torch.ones(4).mncore(), torch.full((4,), 10.).mncore()
    for _ in range(3):
        assert torch.equal(cf(a, a).cpu(), torch.full((4,), 3.0))
    replayed = []
    for _ in range(4):
        out, r = _call(cf, a, b)
        replayed.append(r)
        ref = f(a, b)
        mncore.sync()
        assert torch.equal(out.cpu(), ref.cpu()) and out.cpu().tolist() == [12.0] * 4
    assert not replayed[0] and replayed[-1]  # a new key: recorded, then replayed
    assert torch.equal(cf(a, a).cpu(), torch.full((4,), 3.0))  # the aliased key still right


def test_view_argument_of_a_global_the_step_also_reads():
    """16_arg_aliases_global: recorded as f(W[0]) (the step also reads W), then f(other[0])."""
    W = torch.full((2, 2), 1.).mncore()

    def f(t):
        return t * 100 + W

    cf = mncore.capture(f)
    for _ in range(3):
        assert torch.equal(cf(W[0]).cpu(), f(W[0]).cpu())
    other = torch.full((2, 2), 5.).mncore()
    for _ in range(4):
        out = cf(other[0])
        ref = f(other[0])
        mncore.sync()
        assert torch.equal(out.cpu(), ref.cpu()) and out.cpu().tolist() == [[501.0, 501.0]] * 2
    assert torch.equal(cf(W[0]).cpu(), torch.full((2, 2), 101.0))


# ---------------------------------------------------------------------------------------------- 8. rebinding

_MODEL: Any = None
_OPT: Any = None


def _global_step(x, y):
    _OPT.zero_grad()
    loss = F.cross_entropy(_MODEL(x), y)
    loss.backward()
    _OPT.step()
    return loss


def test_rebinding_the_global_model_and_optimizer_records_again():
    """07_new_model: a second run from the same start, the first model still referenced."""
    global _MODEL, _OPT
    torch.manual_seed(1)
    x, y = torch.randn(5, 4), torch.randint(0, 2, (5,))

    def make():
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2).mncore()
        return m, torch.optim.SGD(m.parameters(), lr=0.1)

    def run(captured: bool):
        global _MODEL, _OPT
        fn = mncore.capture(_global_step) if captured else _global_step
        xd, yd = x.mncore(), y.mncore()
        _MODEL, _OPT = make()
        first = (_MODEL, _OPT)
        losses, replayed = [], []
        for i in range(8):
            if i == 4:
                _MODEL, _OPT = make()  # the old pair stays alive in ``first``
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        return losses, [_cpu(p) for m in (first[0], _MODEL) for p in m.parameters()], replayed

    try:
        cap = run(True)
        lazy = run(False)
    finally:
        _MODEL = _OPT = None
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert torch.equal(cap[0][0], cap[0][4])  # the new model starts where the first did
    assert cap[2][3] and not cap[2][4]  # replaying the first model, then recording for the new one


def test_switching_the_global_optimizer_records_again():
    """07c_switch_optimizer: two existing optimizers over one model; the step reads the global."""
    global _MODEL, _OPT
    base, x, y = _linear_problem()

    def run(captured: bool):
        global _MODEL, _OPT
        _MODEL = copy.deepcopy(base).mncore()
        opts = [torch.optim.SGD(_MODEL.parameters(), lr=0.1, momentum=0.9),
                torch.optim.SGD(_MODEL.parameters(), lr=0.5)]
        _OPT = opts[0]
        fn = mncore.capture(_global_step) if captured else _global_step
        xd, yd = x.mncore(), y.mncore()
        losses, replayed = [], []
        for i in range(8):
            if i == 4:
                _OPT = opts[1]
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        return losses, [_cpu(p) for p in _MODEL.parameters()], replayed

    try:
        cap = run(True)
        lazy = run(False)
    finally:
        _MODEL = _OPT = None
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert cap[2][3] and not cap[2][4]


# ---------------------------------------------------------------------------------------------- 9. forward only


def test_captured_forward_returning_a_loss_with_a_graph_keeps_backward_working():
    """22_forward_only_capture: backward and optimizer step outside the captured forward."""
    base, x, y = _linear_problem()

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def forward(x, y):
            return F.cross_entropy(model(x), y)

        fn = mncore.capture(forward) if captured else forward
        xd, yd = x.mncore(), y.mncore()
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = fn(xd, yd)
            assert loss.requires_grad and loss.grad_fn is not None
            loss.backward()
            opt.step()
            mncore.sync()
            losses.append(_cpu(loss))
        return losses, [_cpu(p) for p in model.parameters()]

    before = mncore.metrics.counters()
    with _Warns() as w:
        cap = run(True)
    d = _delta(before, "replays")
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert d["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "autograd" in msgs[0], msgs[0]


# ---------------------------------------------------------------------------------------------- 10. RNG state


@pytest.mark.parametrize("how", ["set_rng_state", "manual_seed", "fork_rng"])
def test_step_that_sets_the_rng_state_is_refused(how: str):
    """41_rng_restore, 41b_manual_seed_inside (and ``torch.random.fork_rng``, which restores the state)."""
    dm = torch.get_device_module("mncore")

    def f(x):
        if how == "set_rng_state":
            st = dm.get_rng_state()
            a = F.dropout(x, 0.5)
            dm.set_rng_state(st)
            b = F.dropout(x, 0.5)  # the same mask again
            return torch.stack([a, b])
        if how == "manual_seed":
            torch.manual_seed(123)
            return F.dropout(x, 0.5)
        with torch.random.fork_rng(device_type="mncore"):
            torch.manual_seed(3)
            a = F.dropout(x, 0.5)
        return torch.stack([a, F.dropout(x, 0.5)])

    x = torch.ones(64).mncore()

    def run(fn):
        torch.manual_seed(0)
        outs = []
        for _ in range(5):
            outs.append(_cpu(fn(x)))
            mncore.sync()
        return outs

    before = mncore.metrics.counters()
    with _Warns() as w:
        cap = run(mncore.capture(f))
    d = _delta(before, "replays")
    lazy = run(f)
    _equal_lists(cap, lazy)
    if how == "set_rng_state":
        assert all(torch.equal(o[0], o[1]) for o in cap)
    if how == "manual_seed":
        assert all(torch.equal(o, cap[0]) for o in cap)
    if how == "fork_rng":
        assert all(torch.equal(o[0], cap[0][0]) for o in cap)
        assert not torch.equal(cap[0][1], cap[1][1])  # the outer stream moves on
    assert d["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "random" in msgs[0].lower(), msgs[0]


# ---------------------------------------------------------------------------------------------- 11. precision


@pytest.mark.parametrize("device", ["mncore2:auto", "emu2"])
def test_reinit_with_another_float_dtype_records_again(device: str, sim_env):
    """05_reinit_policy: re-init of the same device with another precision policy; the executable of the
    old policy must not replay."""
    mncore.init(device, float_dtype="float")
    torch.manual_seed(0)
    a, b = torch.randn(16, 16), torch.randn(16, 16)

    def f(x, y):
        return x @ y

    cf = mncore.capture(f)
    ad, bd = a.mncore(), b.mncore()
    for _ in range(3):
        float_out = cf(ad, bd).cpu()
    assert torch.equal(float_out, f(ad, bd).cpu())
    mncore.init(device, float_dtype="mixed")
    replayed = []
    for _ in range(3):
        out, r = _call(cf, ad, bd)
        replayed.append(r)
        cap = out.cpu()
        lazy = f(ad, bd).cpu()
        assert torch.equal(cap, lazy)
    assert not torch.equal(lazy, float_out)  # the policies really give different numbers here
    assert not replayed[0]
    mncore.init(device, float_dtype="float")  # and back: the float result again
    assert torch.equal(cf(ad, bd).cpu(), float_out)


def test_autocast_dtype_is_part_of_the_key():
    """08_autocast_dtype: recorded under bfloat16 autocast, then called under float16."""
    torch.manual_seed(0)
    a, b = torch.randn(8, 8).mncore(), torch.randn(8, 8).mncore()

    def f(x, y):
        return x @ y

    cf = mncore.capture(f)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        replayed = []
        for _ in range(3):
            with torch.autocast("mncore", dtype=dtype):
                out, r = _call(cf, a, b)
                ref = f(a, b)
            mncore.sync()
            replayed.append(r)
            assert out.dtype == ref.dtype == dtype
            assert torch.equal(out.cpu(), ref.cpu())
        if dtype is torch.float16:
            assert not replayed[0] and replayed[-1]
        else:
            assert replayed[-1]


# ---------------------------------------------------------------------------------------------- 12. betas


@pytest.mark.parametrize("change", ["assigned", "in_place"])
def test_optimizer_hyperparameters_in_tuples_are_guarded(change: str):
    """20_betas_guard: Adam's betas changed between calls (what OneCycleLR's cycle_momentum does); or a
    list of numbers in the group (a scheduler's own entry) changed in place: the guard's cache of
    unchanged groups must not take the same list object for unchanged values."""
    base, x, y = _linear_problem()

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01, device="mncore"), capturable=True)
        opt.param_groups[0]["schedule"] = [0.9]
        step = _sgd_step(model, opt)
        fn = mncore.capture(step) if captured else step
        xd, yd = x.mncore(), y.mncore()
        losses, replayed = [], []
        for i in range(9):
            if i == 5 and change == "in_place":
                opt.param_groups[0]["schedule"][0] = 0.5
            elif i == 5:
                opt.param_groups[0]["betas"] = (0.5, 0.9)
            loss, r = _call(fn, xd, yd)
            mncore.sync()
            losses.append(_cpu(loss))
            replayed.append(r)
        return losses, [_cpu(p) for p in model.parameters()], replayed

    cap = run(True)
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert cap[2][3] and cap[2][4]  # replaying before the change
    assert not cap[2][5]  # the guard caught it: recorded again
    assert cap[2][-1]  # and replays with the new betas


# ---------------------------------------------------------------------------------------------- 13. numpy scalars


def test_numpy_scalar_arguments_are_keyed_by_value():
    """06c_id_reuse_numpy: a new numpy scalar at a recycled address must not hit the old entry."""
    x = torch.ones(2).mncore()
    cf = mncore.capture(lambda x, a: x * a)
    replayed = []
    for v in (0.5, 0.5, 0.5, 2.0, 3.0, 0.5):
        a = np.float64(v)
        out, r = _call(cf, x, a)
        replayed.append(r)
        assert out.cpu().tolist() == [v, v], (v, out.cpu().tolist())
        del a
    assert replayed == [False, False, True, False, False, True]


# ---------------------------------------------------------------------------------------------- 14. outputs


@dataclass
class Out:
    loss: torch.Tensor


def test_step_returning_an_object_capture_cannot_rebuild_is_refused():
    """43b_dataclass_scalar_output: each call's returned object and tensors stay its own."""
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2).mncore()

    def predict(x):
        with torch.no_grad():
            return Out(m(x).sum())

    batches = [torch.ones(3, 4).mncore()] * 2 + [torch.randn(3, 4).mncore() for _ in range(3)]
    before = mncore.metrics.counters()
    with _Warns() as w:
        cf = mncore.capture(predict)
        outs = [cf(b) for b in batches]
    d = _delta(before, "replays")
    lazy = [predict(b) for b in batches]
    mncore.sync()
    assert all(type(o) is Out for o in outs)
    assert len({id(o) for o in outs}) == len(batches)
    _equal_lists([_cpu(o.loss) for o in outs], [_cpu(o.loss) for o in lazy])
    assert d["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "returns" in msgs[0] and "Out" in msgs[0], msgs[0]


# ---------------------------------------------------------------------------------------------- 15. own modules


def test_mncore_graph_modules_never_join_the_captured_world():
    """44_graphmodule_in_world: a host read runs a graph while the step records."""
    m = torch.nn.Linear(3, 3).mncore()

    def f(x):
        with torch.no_grad():
            y = m(x)
            return y * float(y.sum())  # a host read: its value is computed by a graph of its own

    cf = mncore.capture(f)
    x = torch.ones(2, 3).mncore()
    mncore.metrics.reset()
    with _Warns() as w:
        outs = [_cpu(cf(x)) for _ in range(4)]
    assert len(cf.entries) == 1  # one key: the module state did not change
    assert w.capture == []  # the value read is the same each call: a guard, checked by each replay
    assert mncore.metrics.counters()["replays"] == 2
    _equal_lists(outs, [_cpu(f(x)) for _ in range(4)])


@pytest.mark.parametrize("train", [False, True], ids=["predict", "train"])
def test_plain_mlp_step_has_only_the_keys_its_state_warrants(train: bool):
    """44_graphmodule_in_world: the previous call's graph runs on the worker while the next one records."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 32, generator=g) for _ in range(6)]
    ys = [torch.randint(0, 10, (16,), generator=g) for _ in range(6)]

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def predict(x, y):
            with torch.no_grad():
                return F.cross_entropy(model(x), y)

        step = _sgd_step(model, opt) if train else predict
        fn = mncore.capture(step) if captured else step
        losses = []
        for x, y in zip(xs, ys):
            losses.append(fn(x.mncore(), y.mncore()))
            if not captured:
                mncore.sync()
        mncore.sync()
        return [_cpu(l) for l in losses], [_cpu(p) for p in model.parameters()], fn

    before = mncore.metrics.counters()
    with _Warns() as w:
        cap = run(True)
    d = _delta(before, "replays", "captures")
    lazy = run(False)
    _equal_lists(cap[0], lazy[0])
    _equal_lists(cap[1], lazy[1])
    assert w.capture == []
    if train:  # step 1 (no .grad yet) and the steady state
        assert len(cap[2].entries) == 2
        assert d == {"replays": 3, "captures": 3}
    else:
        assert len(cap[2].entries) == 1
        assert d == {"replays": 4, "captures": 2}


def test_strict_raises_capture_error_once_for_a_refusable_step():
    """28_strict_once: a host read in a strict step, of a value that changes on every call (the first two
    recordings may differ; the third that does is refused)."""
    state = torch.zeros(1).mncore()

    def f(x):
        state.add_(1)
        return (x * state).sum().item()

    cf = mncore.capture(f, strict=True)
    x = torch.ones(3).mncore()
    raised, returned = [], []
    for i in range(5):
        try:
            returned.append(cf(x))
        except mncore.CaptureError as e:
            raised.append(i)
            assert ".item()" in str(e) and "changes between calls" in str(e), str(e)
    assert raised == [2]
    assert returned == [3.0, 6.0, 12.0, 15.0]  # sums of small integers: exact in float32
    assert state.cpu().item() == 5.0  # every call ran the step, as in lazy mode
    assert len(cf.entries) == 1


# ---------------------------------------------------------------------------------------------- 16. implicit sync


def test_sync_then_item_in_a_step_under_implicit_sync_error():
    """47_sync_then_item_error_mode: ``mncore.sync(); loss.item()`` inside the step."""
    mncore.init_cpu(implicit_sync="error", execution="async")
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 1).mncore()

    def step(x):
        with torch.no_grad():
            loss = m(x).sum()
        mncore.sync()
        return loss.item()

    xs = [torch.full((2, 3), float(i)).mncore() for i in range(4)]
    lazy = [step(x) for x in xs]
    cf = mncore.capture(step)
    before = mncore.metrics.counters()
    with _Warns() as w:
        got = [cf(x) for x in xs]
    d = _delta(before, "replays")
    assert got == lazy
    assert d["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert ".item()" in msgs[0], msgs[0]


# ---------------------------------------------------------------------------------------------- 17. wrapping


def test_capturing_a_captured_function_keeps_its_own_options():
    """49_double_capture."""
    def f(x):
        return x * 2

    inner = mncore.capture(f)
    inner_opts = (inner.check_every, inner.strict, inner.max_entries)
    outer = mncore.capture(check_every=7, strict=True, max_entries=2)(inner)
    assert outer.check_every == 7 and outer.strict is True and outer.max_entries == 2
    assert (inner.check_every, inner.strict, inner.max_entries) == inner_opts
    assert inner.strict is False and inner.max_entries == 8
    x = torch.arange(4.0)
    for _ in range(4):
        assert torch.equal(outer(x.mncore()).cpu(), x * 2)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.fn = torch.tanh  # a plain (non-Module) attribute named like one of Captured's

    def forward(self, x):
        return self.fn(self.lin(x))


def test_capturing_a_module_with_an_fn_attribute_calls_its_forward():
    """49b_capture_module_with_fn_attr."""
    torch.manual_seed(0)
    block = _Block().mncore()
    cb = mncore.capture(block)
    replayed = []
    with torch.no_grad():
        for i in range(4):
            x = torch.full((2, 4), float(i)).mncore()
            out, r = _call(cb, x)
            replayed.append(r)
            ref = block(x)
            mncore.sync()
            assert torch.equal(out.cpu(), ref.cpu()), i
    assert replayed[-1]


# ---------------------------------------------------------------------------------------------- 18. -0.0


def test_negative_zero_and_zero_are_different_keys():
    """32_negzero_key: 1 / (x * s) is -inf for s = -0.0."""
    def f(x, s):
        return 1 / (x * s)

    cf = mncore.capture(f)
    x = torch.ones(2).mncore()
    for _ in range(3):
        assert cf(x, 0.0).cpu().tolist() == [float("inf")] * 2
    replayed = []
    for s in (-0.0, -0.0, -0.0, 0.0, -0.0):
        out, r = _call(cf, x, s)
        replayed.append(r)
        ref = f(x, s).cpu()
        assert torch.equal(out.cpu(), ref), (s, out)
        assert out.cpu().tolist() == [float("-inf") if math.copysign(1.0, s) < 0 else float("inf")] * 2, s
    assert replayed == [False, False, True, True, True]  # -0.0: its own key, recorded twice


# ---------------------------------------------------------------------------------------------- 19. warnings


def test_a_python_number_that_changes_every_call_warns_once():
    """18_repeated_warnings: re-validation every 5th call retries the refused step; one warning in all."""
    x = torch.ones(3).mncore()
    k = [0.0]

    def f(x):
        return x * k[0]

    cf = mncore.capture(f, check_every=5)
    before = mncore.metrics.counters()
    with _Warns() as w:
        outs = []
        for i in range(40):
            k[0] = float(i)
            outs.append(_cpu(cf(x)))
    d = _delta(before, "replays")
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "Python number" in msgs[0], msgs[0]
    assert d["replays"] == 0  # a replay would have returned an old number
    for i, o in enumerate(outs):
        assert o.tolist() == [float(i)] * 3, i


# ---------------------------------------------------------------------------------------------- 20. methods


class _Trainer:
    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(4, 2).mncore()

    @mncore.capture
    def predict(self, x):
        with torch.no_grad():
            return self.model(x)


def test_capture_as_a_method_decorator_binds_like_a_function():
    """23_method_decorator: two instances, each its own model."""
    t1, t2 = _Trainer(0), _Trainer(1)
    for t in (t1, t2):
        replayed = []
        for i in range(4):
            x = torch.full((3, 4), float(i)).mncore()
            out, r = _call(t.predict, x)
            replayed.append(r)
            with torch.no_grad():
                ref = t.model(x)
            mncore.sync()
            assert out.shape == (3, 2) and torch.equal(out.cpu(), ref.cpu()), i
        assert replayed[-1]
    assert not torch.equal(t1.model.weight.cpu(), t2.model.weight.cpu())
    x = torch.ones(3, 4).mncore()
    with torch.no_grad():
        assert torch.equal(t1.predict(x).cpu(), t1.model(x).cpu())
        assert torch.equal(t2.predict(x).cpu(), t2.model(x).cpu())


# ---------------------------------------------------------------------------------------------- 21. host args


def test_host_argument_modified_in_place_before_its_upload_is_refused():
    """09_host_arg_mutated: ``xc.mul_(2)`` on a CPU argument, then ``xc.to("mncore")``."""
    def f(xc):
        xc.mul_(2)
        return xc.to("mncore") + 1

    cf = mncore.capture(f)
    before = mncore.metrics.counters()
    got, args = [], []
    with _Warns() as w:
        for i in range(5):
            xc = torch.full((3,), float(i))
            got.append(_cpu(cf(xc)))
            args.append(xc.clone())
    d = _delta(before, "replays")
    want, want_args = [], []
    for i in range(5):
        xc = torch.full((3,), float(i))
        want.append(_cpu(f(xc)))
        want_args.append(xc.clone())
    _equal_lists(got, want)
    _equal_lists(args, want_args)
    assert d["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "host tensor" in msgs[0] and "modified" in msgs[0], msgs[0]


# ---------------------------------------------------------------------------------------------- 22. churning keys


@dataclass
class _ObjectBatch:
    x: torch.Tensor


def test_an_object_argument_made_anew_each_call_warns_once_that_keys_churn():
    """46_dataclass_batch: a dataclass (not a pytree node) is keyed by identity, so each call is a new key;
    once the cache has turned over, one warning names the argument and the fix."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).mncore()

    def predict(b: _ObjectBatch) -> torch.Tensor:
        with torch.no_grad():
            return model(b.x)

    cp = mncore.capture(predict, max_entries=4)
    xs = [torch.randn(3, 4) for _ in range(12)]
    before = mncore.metrics.counters()
    keep = []  # the batches stay alive, so no identity is reused
    with _Warns() as w:
        got = []
        for x in xs:
            keep.append(_ObjectBatch(x.mncore()))
            got.append(_cpu(cp(keep[-1])))
    want = [_cpu(predict(_ObjectBatch(x.mncore()))) for x in xs]
    _equal_lists(got, want)
    assert _delta(before, "replays")["replays"] == 0
    msgs = w.capture
    assert len(msgs) == 1, msgs
    assert "_ObjectBatch object, keyed by identity" in msgs[0] and "pytree" in msgs[0], msgs[0]


def test_the_world_key_tells_every_requires_grad_and_grad_state_apart():
    """The call key's part for a parameter is one small int: each of the four (requires_grad, has a
    ``.grad``) states must give another key, the same state an equal one, and a parameter set to None
    in its module is skipped (not an error)."""
    from mncore.capture.world import World

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).mncore()
    model[1].bias = None
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    world = World()
    world.add(model)
    world.add(opt)
    w = model[0].weight
    keys = {}
    for requires_grad in (False, True):
        for has_grad in (False, True):
            w.requires_grad_(requires_grad)
            w.grad = torch.zeros(2, 3).mncore() if has_grad else None
            keys[requires_grad, has_grad] = world.key()
            assert world.key() == keys[requires_grad, has_grad]
    assert len(set(keys.values())) == 4
    # the weight is reached through its module and through the optimizer: params() lists it once
    assert sum(p is w for p in world.params()) == 1
    model.train(False)
    assert world.key() != keys[True, True]
