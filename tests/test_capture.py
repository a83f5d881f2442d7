"""Step capture (``mncore.capture``): replayed steps against the same step retraced in lazy mode
(bit-identical on pfvm:cpu, same seeds) and against eager PyTorch on CPU (float32 tolerances).

Every test also checks the capture metrics, so a pass proves the step was replayed (or, for the
refusals, that it was not) rather than silently traced every call.
"""
from __future__ import annotations

import copy
import gc
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import mncore
from tests.helpers import capture_warning_messages as _capture_warnings
from tests.helpers import counter_delta as _delta
from tests.helpers import cpu_copy as _to_cpu
import model_zoo
from mncore.capture import Captured

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("no_capture_check")]

NEW_KEY_REASON = "a new call key (argument shapes, values, modes or module state)"  # metrics reason




# ---------------------------------------------------------------------------------------------- helpers




def _new_reasons(before: dict) -> dict:
    """``metrics.capture_retraces()`` counted since ``before`` (another test may have counted earlier)."""
    now = mncore.metrics.capture_retraces()
    return {why: n - before.get(why, 0) for why, n in now.items() if n > before.get(why, 0)}




def _line(marker: str) -> str:
    """``test_capture.py:N`` for the line of this file that ends with ``# <marker>``."""
    lines = Path(__file__).read_text().splitlines()
    hits = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, marker
    return f"{Path(__file__).name}:{hits[0]}"


def _ce(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return F.cross_entropy(model(b["x"]), b["y"])


def _mlp_batches(width: int, n: int, batch: int = 64, classes: int = 10, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(batch, width, generator=g), "y": torch.randint(0, classes, (batch,), generator=g)}
            for _ in range(n)]


def _seed_mlp(width: int = 512, classes: int = 10) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, classes))




def _opt_state(opt: torch.optim.Optimizer) -> dict:
    """The optimizer's per-parameter state (momentum buffers, Adam moments, step counts) on CPU."""
    return {f"{i}.{k}": _to_cpu(v) for i, st in enumerate(opt.state_dict()["state"].values())
            for k, v in st.items() if isinstance(v, torch.Tensor)}


@dataclass
class Run:
    losses: list[torch.Tensor]
    state: dict[str, torch.Tensor]
    opt_state: dict[str, torch.Tensor]
    step: Any = None
    model: Any = None
    opt: Any = None


def _train(model: torch.nn.Module, batches: list[dict], mode: str, make_opt: Callable, loss_fn: Callable = _ce, *,
           make_sched: Callable | None = None, seed: int | None = None, capture: Callable = mncore.capture) -> Run:
    """Train a copy of ``model`` with the usual step (zero_grad, loss, backward, step) on ``batches``.

    ``mode``: "eager" (CPU), "lazy" (mncore, ``mncore.sync()`` after each step, nothing captured) or
    "capture" (the same step function wrapped by ``capture``; no sync around it). ``make_opt(params,
    device)``; ``make_sched(opt)`` steps after every call, outside the step.
    """
    dev = "cpu" if mode == "eager" else "mncore"
    model = copy.deepcopy(model).to(dev)
    opt = make_opt(model.parameters(), dev)
    sched = make_sched(opt) if make_sched else None

    def step(b):
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        return loss

    fn = capture(step) if mode == "capture" else step
    if seed is not None:
        torch.manual_seed(seed)
    losses = []
    for b in batches:
        losses.append(fn(model_zoo.batch_to(b, dev)))
        if mode == "lazy":
            mncore.sync()
        if sched is not None:
            sched.step()
    if mode != "eager":
        mncore.sync()  # a scheduler's tensor write outside the step may still be pending
    return Run([_to_cpu(l) for l in losses], _to_cpu(model.state_dict()), _opt_state(opt), fn, model, opt)


def _assert_identical(a: Run, b: Run) -> None:
    """Bit-identical losses, parameters, buffers and optimizer state (captured vs retraced lazy)."""
    assert len(a.losses) == len(b.losses)
    for i, (x, y) in enumerate(zip(a.losses, b.losses)):
        assert torch.equal(x, y), f"loss {i}: {x} != {y}"
    for d1, d2 in ((a.state, b.state), (a.opt_state, b.opt_state)):
        assert d1.keys() == d2.keys()
        for k in d1:
            assert torch.equal(d1[k], d2[k]), k


def _assert_close(got: Run, eager: Run, **tol: float) -> None:
    torch.testing.assert_close(torch.stack(got.losses), torch.stack(eager.losses), **tol)
    for d1, d2 in ((got.state, eager.state), (got.opt_state, eager.opt_state)):
        assert d1.keys() == d2.keys()
        for k in d1:
            torch.testing.assert_close(d1[k], d2[k], **tol, msg=lambda m, k=k: f"{k}: {m}")


# ---------------------------------------------------------------------------------------------- 1. seed MLP


def test_seed_mlp_sgd_momentum_20_steps_replays_bit_identical_to_lazy():
    model = _seed_mlp()
    batches = _mlp_batches(512, 20)
    sgd = lambda p, dev: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    before, reasons = mncore.metrics.counters(), mncore.metrics.capture_retraces()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cap = _train(model, batches, "capture", sgd)
    d = _delta(before, "captures", "replays", "capture_retraces")
    assert _capture_warnings(rec) == []
    # step 1 records (no .grad yet: its own key), steps 2 and 3 record the steady state and agree
    assert d["captures"] == 3
    assert d["replays"] == 20 - d["captures"]
    assert d["capture_retraces"] == 1 and _new_reasons(reasons) == {NEW_KEY_REASON: 1}  # step 2's new key
    lazy = _train(model, batches, "lazy", sgd)
    _assert_identical(cap, lazy)
    eager = _train(model, batches, "eager", sgd)
    _assert_close(cap, eager)


def test_a_replay_cuts_the_graph_only_when_something_is_pending():
    """A replay binds device values, so work traced before the call is cut first; with nothing traced
    since the last cut there is nothing to cut (a cut per replay cost host time, bumped the view-cache
    epoch and counted a sync nobody made)."""
    model = _seed_mlp(width=16)
    batches = _mlp_batches(16, 6)
    eager = copy.deepcopy(model)
    lazy = copy.deepcopy(model).to("mncore")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, lazy)]

    def train(m, opt, b):
        opt.zero_grad()
        loss = _ce(m, b)
        loss.backward()
        opt.step()
        return loss

    step = mncore.capture(lambda b: train(lazy, opts[1], b))
    device_batches = [{k: v.to("mncore") for k, v in b.items()} for b in batches]
    side = torch.arange(6.0).to("mncore")
    for i, b in enumerate(batches):
        want = train(eager, opts[0], b)
        mncore.sync()  # the uploads and anything before: nothing is pending when the step is called
        before = mncore.metrics.counters()
        if i == 5:
            side = side * 2  # traced before the call: the replay must cut it first
        got = step(device_batches[i])
        d = _delta(before, "syncs", "replays")
        if i >= 3:
            assert d == {"syncs": 1 if i == 5 else 0, "replays": 1}, (i, d)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(side.cpu(), torch.arange(6.0) * 2)
    for p, q in zip(lazy.parameters(), eager.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- 2. ResNet-18


def test_resnet18_tiny_train_mode_replays_update_batchnorm_running_stats():
    pytest.importorskip("torchvision")
    spec = model_zoo.get("resnet18")
    model = spec.build("tiny")
    batches = [spec.make_batch("tiny", seed=i) for i in range(6)]
    make = lambda p, dev: spec.optimizer(p)  # noqa: E731  (SGD lr 0.01, momentum 0.9)
    loss = spec.loss
    before = mncore.metrics.counters()
    cap = _train(model, batches, "capture", make, loss)
    d = _delta(before, "captures", "replays")
    assert d["captures"] == 3 and d["replays"] == 3
    lazy = _train(model, batches, "lazy", make, loss)
    _assert_identical(cap, lazy)
    bn_keys = [k for k in cap.state if k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
    assert len(bn_keys) == 3 * 20  # every batch-norm layer's statistics are compared
    assert int(cap.state["bn1.num_batches_tracked"]) == 6  # the replays counted their batches too
    initial = model.state_dict()
    assert not torch.equal(cap.state["layer4.1.bn2.running_mean"], initial["layer4.1.bn2.running_mean"])
    eager = _train(model, batches, "eager", make, loss)
    # Same float32 kernels on the same inputs; convolution and batch-norm reductions may sum in another
    # order, which after six momentum steps leaves differences of a few 1e-5 (as in test_training).
    _assert_close(cap, eager, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------- 3. GPT-2


def _gpt2_tiny(dropout: float) -> torch.nn.Module:
    pytest.importorskip("transformers")
    spec = model_zoo.get("gpt2_small")
    cfg = spec.config("tiny")
    torch.manual_seed(0)
    return spec.build_fn(dropout=dropout, **cfg).train()


def _gpt2_batches(n: int) -> list[dict]:
    spec = model_zoo.get("gpt2_small")
    return [spec.make_batch("tiny", seed=10 + i) for i in range(n)]


def _adamw(capturable: bool) -> Callable:
    return lambda p, dev: torch.optim.AdamW(p, lr=1e-3, capturable=capturable and dev != "cpu")


def test_gpt2_tiny_adamw_capturable_with_dropout_replays_like_retrace():
    spec = model_zoo.get("gpt2_small")
    model = _gpt2_tiny(0.1)
    batches = _gpt2_batches(6)
    before = mncore.metrics.counters()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = _train(model, batches, "capture", _adamw(True), spec.loss, seed=123)
    d = _delta(before, "captures", "replays")
    assert _capture_warnings(rec) == []
    assert d["captures"] == 3 and d["replays"] == 3
    lazy = _train(model, batches, "lazy", _adamw(True), spec.loss, seed=123)
    _assert_identical(a, lazy)
    b = _train(model, batches, "capture", _adamw(True), spec.loss, seed=123)
    _assert_identical(a, b)  # two captured runs from one seed
    c = _train(model, batches, "capture", _adamw(True), spec.loss, seed=124)
    assert not torch.equal(torch.stack(c.losses[3:]), torch.stack(a.losses[3:]))  # the seed reaches the replays


def test_gpt2_tiny_keeps_replaying_through_periodic_re_validations():
    """transformers' mask code makes scalar host tensors on every call; two equal ones become a constant,
    and a re-validation (here every 3rd call of the key) must agree with it, not refuse the step."""
    spec = model_zoo.get("gpt2_small")
    model = _gpt2_tiny(0.0)
    batches = _gpt2_batches(10)
    before = mncore.metrics.counters()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = _train(model, batches, "capture", _adamw(True), spec.loss, capture=mncore.capture(check_every=3))
    d = _delta(before, "captures", "replays")
    assert _capture_warnings(rec) == []
    # call 1 records its own key (no .grad yet); the second key's calls 2, 3 record, 4, 7, 10 re-validate
    assert d["captures"] == 6 and d["replays"] == 4
    _assert_identical(a, _train(model, batches, "lazy", _adamw(True), spec.loss))


def test_gpt2_tiny_replays_draw_fresh_dropout_numbers_each_call():
    spec = model_zoo.get("gpt2_small")
    batch = model_zoo.batch_to(_gpt2_batches(1)[0], "mncore")

    def losses(captured: bool) -> tuple[list[torch.Tensor], int]:
        model = _gpt2_tiny(0.1).mncore()

        def loss_of(b):
            with torch.no_grad():
                return spec.loss(model, b)

        fn = mncore.capture(loss_of) if captured else loss_of
        torch.manual_seed(7)
        before = mncore.metrics.counters()["replays"]
        out = []
        for _ in range(5):
            out.append(fn(batch))
            mncore.sync()
        return [l.cpu() for l in out], mncore.metrics.counters()["replays"] - before

    cap, replays = losses(True)
    assert replays == 3  # calls 1 and 2 record and agree; 3, 4, 5 replay
    ref, _ = losses(False)
    for x, y in zip(cap, ref):
        assert torch.equal(x, y)
    # the same inputs and weights every call: only dropout's random numbers differ, and each replay draws new ones
    assert len({float(l) for l in cap}) == 5
    eval_model = _gpt2_tiny(0.1).eval()
    eager = spec.loss(eval_model, _gpt2_batches(1)[0]).detach()
    for l in cap:  # dropout moves the loss around the no-dropout value, not far (random init: loss ~ ln 128)
        assert abs(float(l) - float(eager)) < 0.5


def test_gpt2_tiny_without_dropout_captured_matches_eager():
    spec = model_zoo.get("gpt2_small")
    model = _gpt2_tiny(0.0)
    batches = _gpt2_batches(5)
    before = mncore.metrics.counters()["replays"]
    cap = _train(model, batches, "capture", _adamw(True), spec.loss)
    assert mncore.metrics.counters()["replays"] - before == 2
    eager = _train(model, batches, "eager", _adamw(False), spec.loss)
    # Eager CPU AdamW runs the for-loop form, mncore's the foreach/capturable one: the same update in a
    # different operation order, so parameters agree to a few float32 ulps of the update (test_training).
    _assert_close(cap, eager, rtol=1e-4, atol=5e-5)


# ---------------------------------------------------------------------------------------------- 4. accumulation


@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
def test_gradient_accumulation_outside_optimizer_step(set_to_none: bool):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(32, 12, batch=16)

    def run(mode: str):
        dev = "cpu" if mode == "eager" else "mncore"
        model = copy.deepcopy(base).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def micro(b):
            loss = _ce(model, b) / 2
            loss.backward()
            return loss

        fn = mncore.capture(micro) if mode == "capture" else micro
        losses, grads = [], []
        for i, b in enumerate(batches):
            losses.append(fn(model_zoo.batch_to(b, dev)))
            if mode == "lazy":
                mncore.sync()
            if i % 2 == 1:
                grads.append([_to_cpu(p.grad) for p in model.parameters()])
                opt.step()
                opt.zero_grad(set_to_none=set_to_none)
                if mode == "lazy":
                    mncore.sync()
        if mode != "eager":
            mncore.sync()
        return Run([_to_cpu(l) for l in losses], _to_cpu(model.state_dict()), _opt_state(opt)), grads

    before = mncore.metrics.counters()
    cap, cap_grads = run("capture")
    d = _delta(before, "captures", "replays")
    if set_to_none:
        # two keys (first micro-batch: no .grad; second: accumulate), each recorded twice, then replayed
        assert d == {"captures": 4, "replays": 8}
    else:
        # only the first call sees no .grad; then every call accumulates into zeroed gradients
        assert d == {"captures": 3, "replays": 9}
    lazy, lazy_grads = run("lazy")
    _assert_identical(cap, lazy)
    for gs, hs in zip(cap_grads, lazy_grads):
        for g, h in zip(gs, hs):
            assert torch.equal(g, h)
    eager, eager_grads = run("eager")
    _assert_close(cap, eager)
    for gs, hs in zip(cap_grads, eager_grads):
        for g, h in zip(gs, hs):
            torch.testing.assert_close(g, h)


# ---------------------------------------------------------------------------------------------- 5. tensor lr


@pytest.mark.parametrize("sched", ["lambda", "step"])
def test_tensor_learning_rate_driven_by_scheduler_outside_is_followed_by_replays(sched: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(16, 10, batch=8)

    def make_opt(p, dev):
        lr = 0.05 if dev == "cpu" else torch.tensor(0.05, device=dev)
        return torch.optim.AdamW(p, lr=lr, capturable=dev != "cpu")

    make_sched = {
        "lambda": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)),
        "step": lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3),
    }[sched]
    before, reasons = mncore.metrics.counters(), mncore.metrics.capture_retraces()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cap = _train(model, batches, "capture", make_opt, make_sched=make_sched)
    d = _delta(before, "captures", "replays")
    assert _capture_warnings(rec) == []
    assert d["captures"] == 3 and d["replays"] == 7
    assert _new_reasons(reasons) == {NEW_KEY_REASON: 1}  # no hyperparameter guard fired: the lr is a tensor
    lr = cap.opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device.type == "mncore"
    assert float(lr) < 0.05 * 0.2  # the schedule really moved it during the replays
    lazy = _train(model, batches, "lazy", make_opt, make_sched=make_sched)
    _assert_identical(cap, lazy)
    eager = _train(model, batches, "eager", make_opt, make_sched=make_sched)  # float lr, same schedule
    _assert_close(cap, eager)


# ---------------------------------------------------------------------------------------------- 6. shapes


def test_changing_batch_shape_gets_a_second_entry_and_both_replay():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    sizes = [8, 5] * 7  # a full batch and the epoch's short last batch, alternating
    g = torch.Generator().manual_seed(3)
    batches = [{"x": torch.randn(n, 16, generator=g), "y": torch.randint(0, 10, (n,), generator=g)} for n in sizes]
    sgd = lambda p, dev: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731

    replayed: list[bool] = []

    def counting(fn):
        step = mncore.capture(fn)

        def call(b):
            before = mncore.metrics.counters()["replays"]
            out = step(b)
            replayed.append(mncore.metrics.counters()["replays"] == before + 1)
            return out
        call.captured = step
        return call

    cap = _train(base, batches, "capture", sgd, capture=counting)
    # per shape: recorded until two recordings agree (the first call of all also had no .grad)
    assert replayed == [False] * 5 + [True] * 9
    assert {b["x"].shape[0] for b, r in zip(batches, replayed) if r} == {8, 5}
    assert len(cap.step.captured.entries) == 3
    lazy = _train(base, batches, "lazy", sgd)
    _assert_identical(cap, lazy)
    eager = _train(base, batches, "eager", sgd)
    _assert_close(cap, eager)


def test_plain_argument_values_are_part_of_the_key():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    x = torch.randn(6, 8)
    dev_model = copy.deepcopy(model).mncore()
    xd = x.mncore()

    @mncore.capture
    def scaled(inp, scale, shift=0.0):
        with torch.no_grad():
            return dev_model(inp) * scale + shift

    before = mncore.metrics.counters()["replays"]
    outs = []
    for i in range(12):
        scale, shift = (0.5, 0.0) if i % 2 == 0 else (2.0, 1.0)
        outs.append((scale, shift, scaled(xd, scale, shift=shift)))
    assert mncore.metrics.counters()["replays"] - before == 8  # two keys, each recorded twice
    with torch.no_grad():
        for scale, shift, out in outs:
            lazy = dev_model(xd) * scale + shift
            mncore.sync()
            assert torch.equal(out.cpu(), lazy.cpu())
            torch.testing.assert_close(out.cpu(), model(x) * scale + shift)


# ---------------------------------------------------------------------------------------------- 7. refusals

# For each case: a phrase of the cause, and the marker of the line the message must name (None: no line).
REFUSALS = {
    "item_of_loss": ([".item()", "host"], "refusal:item_of_loss"),
    "item_early": ([".item()", "host"], "refusal:item_early"),
    "print_of_loss": (["print()", "host"], "refusal:print_of_loss"),
    "print_early": (["print()", "host"], "refusal:print_early"),
    "cpu_of_loss": ([".cpu()", "host"], "refusal:cpu_of_loss"),
    "cpu_early": ([".cpu()", "host"], "refusal:cpu_early"),
    "nonzero": (["nonzero", "eagerly", "its output shape depends on values"], "refusal:nonzero"),
    "no_shape_function": (["multi_margin_loss_backward", "eagerly", "no shape function"], None),  # not "depends on values"
    "steplr_float_lr": (["hyperparameter"], None),
    "adam_not_capturable": (["Python number", "capturable=True"], "refusal:opt_step"),
    "host_tensor_mutated": (["modified inside the function"], "refusal:host_tensor_mutated"),
    "changing_graph": (["graph differs"], "refusal:changing_graph"),
    "host_upload_changes": (["made anew on every call"], "refusal:host_upload_changes"),
    "host_write": (["copy_ writes into the host tensor"], "refusal:host_write"),  # a read, then a host write
}


def _refusal_run(case: str, mode: str, base: torch.nn.Module, batches: list[dict], strict: bool = False):
    """Train ``base`` with a step that capture must refuse for the reason ``case``; returns the run and what
    it logged. In strict mode the CaptureError propagates."""
    dev = "cpu" if mode == "eager" else "mncore"
    model = copy.deepcopy(base).to(dev)
    if case == "adam_not_capturable":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9) if case == "steplr_float_lr" else None
    host = torch.zeros(10)
    flag = torch.zeros(())
    calls = [0]
    log: list = []

    def step(x, y):
        calls[0] += 1
        opt.zero_grad()
        logits = model(x)
        if case == "item_early":
            log.append(logits.sum().item())  # refusal:item_early
        elif case == "print_early":
            print(logits)  # refusal:print_early
        elif case == "cpu_early":
            log.append(logits.cpu().sum())  # refusal:cpu_early
        elif case == "nonzero":
            keep = torch.nonzero(y != 3).squeeze(1)  # refusal:nonzero
            logits, y = logits[keep], y[keep]
        elif case == "host_tensor_mutated":
            logits = logits + host.add_(0.25).to(x.device)  # refusal:host_tensor_mutated
        elif case == "changing_graph":
            for _ in range(calls[0]):
                logits = logits * 0.9  # refusal:changing_graph
        elif case == "host_upload_changes":
            logits = logits + torch.full((10,), 0.1 * calls[0]).to(x.device)  # refusal:host_upload_changes
        loss = F.multi_margin_loss(logits, y) if case == "no_shape_function" else F.cross_entropy(logits, y)
        if case == "item_of_loss":
            log.append(loss.item())  # refusal:item_of_loss
        elif case == "print_of_loss":
            print(loss)  # refusal:print_of_loss
        elif case == "cpu_of_loss":
            log.append(loss.cpu())  # refusal:cpu_of_loss
        elif case == "host_write":
            flag.copy_((y >= 0).all())  # refusal:host_write
            log.append(flag.item())
        loss.backward()
        opt.step()  # refusal:opt_step
        return loss

    fn = mncore.capture(step, strict=True) if strict else mncore.capture(step) if mode == "capture" else step
    losses = []
    for b in batches:
        losses.append(fn(b["x"].to(dev), b["y"].to(dev)))
        if mode == "lazy":
            mncore.sync()
        if sched is not None:
            sched.step()
    if mode != "eager":
        mncore.sync()
    run = Run([_to_cpu(l) for l in losses], _to_cpu(model.state_dict()), _opt_state(opt))
    return run, [float(v) for v in log]


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_step_warns_once_and_keeps_right_numbers(case: str):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    batches = _mlp_batches(12, 6, batch=8)
    phrases, marker = REFUSALS[case]
    mncore.metrics.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cap, cap_log = _refusal_run(case, "capture", base, batches)
    msgs = _capture_warnings(rec)
    assert len(msgs) == 1, msgs
    for phrase in phrases:
        assert phrase in msgs[0], (phrase, msgs[0])
    if marker is not None:
        assert _line(marker) in msgs[0], msgs[0]
    assert mncore.metrics.counters()["replays"] == 0  # refused: every call traced
    lazy, lazy_log = _refusal_run(case, "lazy", base, batches)
    _assert_identical(cap, lazy)
    assert cap_log == lazy_log
    eager, eager_log = _refusal_run(case, "eager", base, batches)
    _assert_close(cap, eager)
    torch.testing.assert_close(torch.tensor(cap_log), torch.tensor(eager_log))


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_step_in_strict_mode_raises_capture_error(case: str):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    batches = _mlp_batches(12, 6, batch=8)
    phrases, _ = REFUSALS[case]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(mncore.CaptureError) as e:
            _refusal_run(case, "capture", base, batches, strict=True)
    assert _capture_warnings(rec) == []  # strict raises instead of warning
    for phrase in phrases:
        assert phrase in str(e.value)


def test_refusal_is_reported_in_metrics():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
    mncore.metrics.reset()
    with pytest.warns(mncore.CaptureWarning):
        _refusal_run("host_upload_changes", "capture", base, _mlp_batches(12, 5, batch=8))
    reasons = mncore.metrics.capture_retraces()
    assert any("made anew on every call" in why for why in reasons)
    assert mncore.metrics.counters()["capture_retraces"] == sum(reasons.values())
    text = mncore.metrics.report()
    assert "capture retraces" in text and "made anew on every call" in text
    assert re.search(r"captures\s+\d+", text) and re.search(r"replays\s+0\b", text)
    mncore.metrics.reset()
    assert mncore.metrics.capture_retraces() == {}
    assert mncore.metrics.counters()["captures"] == 0 and mncore.metrics.counters()["replays"] == 0


# ---------------------------------------------------------------------------------------------- 7b. host reads as guards


def _masked_ce(model: torch.nn.Module, b: dict) -> torch.Tensor:
    """The check transformers makes before it drops an attention mask: a host read that picks a branch."""
    logits = model(b["x"])
    mask = b["mask"]
    if bool(mask.all()):  # guard:read
        return F.cross_entropy(logits, b["y"])
    return (F.cross_entropy(logits, b["y"], reduction="none") * mask).sum() / mask.sum()


def _masked_batches(pattern: str) -> list[dict]:
    """One batch per letter: ``o`` with a mask of ones, ``h`` with holes in it."""
    batches = _mlp_batches(12, len(pattern), batch=8)
    for b, kind in zip(batches, pattern):
        b["mask"] = torch.ones(8) if kind == "o" else torch.tensor([1.0, 0, 1, 1, 0, 1, 1, 1])
    return batches


def _guarded_runs(pattern: str, capture: Callable = mncore.capture,
                  dropout: bool = False) -> tuple[list[str], dict]:
    """The masked step on the batches of ``pattern`` captured (by ``capture``) and in lazy mode, from one
    seed, bit for bit alike, and (without dropout, whose stream is mncore's own) close to eager; returns
    the capture warnings and the captured run's retrace reasons and replays."""
    torch.manual_seed(0)
    layers = [torch.nn.Linear(12, 16), torch.nn.ReLU()] + [torch.nn.Dropout(0.3)] * dropout + [torch.nn.Linear(16, 10)]
    base = torch.nn.Sequential(*layers)
    batches = _masked_batches(pattern)
    sgd = lambda params, dev: torch.optim.SGD(params, lr=0.1, momentum=0.9)  # noqa: E731
    mncore.metrics.reset()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cap = _train(base, batches, "capture", sgd, _masked_ce, capture=capture, seed=1)
    reasons = mncore.metrics.capture_retraces()
    cap_replays = mncore.metrics.counters()["replays"]
    _assert_identical(cap, _train(base, batches, "lazy", sgd, _masked_ce, seed=1))
    if not dropout:
        _assert_close(cap, _train(base, batches, "eager", sgd, _masked_ce))
    return _capture_warnings(rec), {"reasons": reasons, "replays": cap_replays}


def test_a_host_read_whose_value_holds_is_a_guard_and_the_step_replays():
    """The read is answered by a graph of its own while the step records, and each replay checks it."""
    warned, seen = _guarded_runs("oooooooo")
    assert warned == []
    # calls 1 and 2 have different keys (no .grad yet, then .grad), 3 agrees with 2, 4-8 replay
    assert seen["replays"] == 5


def test_a_replay_whose_host_read_changed_writes_nothing_and_traces_the_step():
    """Call 6 brings holes in the mask: its replay finds the value changed, writes nothing, and the
    step is traced (the other branch); the two calls after it record the ones-branch again."""
    warned, seen = _guarded_runs("ooooohoooo")
    assert warned == []
    assert seen["replays"] == 4  # calls 4, 5, 9, 10
    changed = [why for why in seen["reasons"] if "changed" in why]
    assert len(changed) == 1 and _line("guard:read") in changed[0], seen["reasons"]


@pytest.mark.parametrize("pattern", ["ooooo" "hhhh", "ooooo" "h" "ooooo"], ids=["stays", "returns"])
def test_a_re_validation_that_meets_a_changed_host_read_records_again_without_refusing(pattern: str):
    """Call 6 is the key's 5th, a re-validation, and brings holes: new data, not a step capture misread, so
    it counts as no disagreement, where another difference would refuse the step. The step records again
    and replays: from call 8 on whether the holes stay (call 7 agrees with 6) or the mask is full again
    (7 differs from 6, as two recordings may, and 8 agrees with 7); call 11 is the next re-validation."""
    warned, seen = _guarded_runs(pattern, capture=lambda f: mncore.capture(f, check_every=5))
    assert warned == []
    assert seen["replays"] == 4  # calls 4, 5, then 8, 9 or 9, 10


def test_a_replay_whose_host_read_changed_gives_back_its_random_seeds():
    """The replay found the value changed after it drew its dropout seeds: the traced call must draw the
    seeds lazy mode draws, or every later step differs from lazy mode's."""
    _guarded_runs("ooooohoooo", dropout=True)  # identical to lazy mode from one seed (checked inside)


def test_host_reads_that_keep_changing_are_refused_naming_the_line():
    """Each replay finds the mask's branch changed (three in a row): capture stops replaying and warns once;
    every call stays right."""
    warned, seen = _guarded_runs("oooh" "hoo" "hhoo" "hh")
    assert len(warned) == 1, warned
    assert "replays in a row" in warned[0] and _line("guard:read") in warned[0], warned[0]
    assert seen["replays"] == 0  # each replay found the value changed: none was completed


# ---------------------------------------------------------------------------------------------- 8. modes


def test_eval_mode_between_calls_does_not_replay_the_train_graph():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10), torch.nn.Dropout(0.5))
    x = torch.randn(64, 16)
    phases = ["train"] * 3 + ["eval"] * 3 + ["train"] * 3 + ["eval"] * 3

    def run(captured: bool):
        model = copy.deepcopy(base).mncore()

        def fwd(inp):
            with torch.no_grad():
                return model(inp)

        fn = mncore.capture(fwd) if captured else fwd
        torch.manual_seed(11)
        outs, stats, replayed = [], [], []
        xd = x.mncore()
        for phase in phases:
            model.train(phase == "train")
            before = mncore.metrics.counters()["replays"]
            outs.append(fn(xd))
            mncore.sync()
            replayed.append(mncore.metrics.counters()["replays"] == before + 1)
            stats.append((_to_cpu(model[1].running_mean), _to_cpu(model[1].running_var)))
        return [o.cpu() for o in outs], stats, replayed

    cap, cap_stats, replayed = run(True)
    # each mode records twice, then replays; back in a mode seen before, its entry replays at once
    assert replayed == [False, False, True, False, False, True, True, True, True, True, True, True]
    lazy, lazy_stats, _ = run(False)
    for a, b in zip(cap, lazy):
        assert torch.equal(a, b)
    for (m1, v1), (m2, v2) in zip(cap_stats, lazy_stats):
        assert torch.equal(m1, m2) and torch.equal(v1, v2)

    # eager: the same model with dropout taken out (it is the last layer and batch norm precedes it)
    ref = copy.deepcopy(base)
    ref[4] = torch.nn.Identity()
    with torch.no_grad():
        for i, phase in enumerate(phases):
            ref.train(phase == "train")
            z = ref(x)
            torch.testing.assert_close(cap_stats[i][0], ref[1].running_mean)
            torch.testing.assert_close(cap_stats[i][1], ref[1].running_var)
            if phase == "eval":  # no dropout, running statistics: exactly the eager eval output
                torch.testing.assert_close(cap[i], z)
            else:  # dropout p=0.5: kept values are scaled by 2, about half are dropped
                kept = cap[i] != 0
                torch.testing.assert_close(cap[i][kept], 2 * z[kept])
                assert 0.35 < 1 - kept.float().mean().item() < 0.65  # 640 values: 7.6 sigma
    assert torch.equal(cap[3], cap[4]) and torch.equal(cap[4], cap[5])  # eval: deterministic, stats frozen
    assert not torch.equal(cap[6], cap[7]) and not torch.equal(cap[7], cap[8])  # train replays: fresh masks


def test_no_grad_calls_get_their_own_entry():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(16, 8, batch=8)
    val = _mlp_batches(16, 1, batch=8, seed=9)[0]

    def run(mode: str):
        dev = "cpu" if mode == "eager" else "mncore"
        model = copy.deepcopy(base).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            if torch.is_grad_enabled():  # a training call; under no_grad the same function only evaluates
                opt.zero_grad()
                loss.backward()
                opt.step()
            return loss

        fn = mncore.capture(step) if mode == "capture" else step
        train_losses, val_losses, val_replays, unchanged = [], [], 0, True
        vx, vy = val["x"].to(dev), val["y"].to(dev)
        for b in batches:
            train_losses.append(fn(b["x"].to(dev), b["y"].to(dev)))
            if mode == "lazy":
                mncore.sync()
            params = [_to_cpu(p) for p in model.parameters()]
            before = mncore.metrics.counters()["replays"]
            with torch.no_grad():
                val_losses.append(fn(vx, vy))
            if mode != "eager":
                mncore.sync()
            val_replays += mncore.metrics.counters()["replays"] - before
            unchanged &= all(torch.equal(p, _to_cpu(q)) for p, q in zip(params, model.parameters()))
        if mode != "eager":
            mncore.sync()
        run = Run([_to_cpu(l) for l in train_losses + val_losses], _to_cpu(model.state_dict()), _opt_state(opt))
        return run, val_replays, unchanged

    before = mncore.metrics.counters()
    cap, val_replays, unchanged = run("capture")
    d = _delta(before, "captures", "replays")
    assert unchanged  # a no_grad call never replays the training graph
    assert val_replays == 6  # the no_grad key records twice, then replays
    assert d["replays"] == 6 + 5  # train: step 1 (no .grad) then two recordings of the steady state
    lazy, _, lazy_unchanged = run("lazy")
    assert lazy_unchanged
    _assert_identical(cap, lazy)
    eager, _, _ = run("eager")
    _assert_close(cap, eager)


# ---------------------------------------------------------------------------------------------- 9. exceptions


@pytest.mark.parametrize("where", ["after_forward", "after_backward"])
def test_exception_while_recording_leaves_nothing_half_captured(where: str):
    mncore.init_cpu(implicit_sync="error", execution="async")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(16, 12, batch=8)
    fail_at = {3, 5}  # the recording that would have made the step replayable, and the one after

    def run(mode: str):
        dev = "cpu" if mode == "eager" else "mncore"
        model = copy.deepcopy(base).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        calls = [0]

        def step(x, y):
            calls[0] += 1
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            if where == "after_forward" and calls[0] in fail_at:
                raise RuntimeError("bad batch")
            loss.backward()
            if where == "after_backward" and calls[0] in fail_at:
                raise RuntimeError("bad batch")
            opt.step()
            return loss

        fn = mncore.capture(step) if mode == "capture" else step
        losses, replayed = [], []
        for i, b in enumerate(batches):
            before = mncore.metrics.counters()["replays"]
            try:
                losses.append(fn(b["x"].to(dev), b["y"].to(dev)))
            except RuntimeError as e:
                assert "bad batch" in str(e) and i + 1 in fail_at
                if dev == "mncore":  # the runtime is in plain lazy mode again: an explicit sync cuts now
                    probe = torch.ones(3, device="mncore") * 2
                    mncore.sync()
                    assert probe.tolist() == [2.0, 2.0, 2.0]
            if dev == "mncore":
                mncore.sync()
            replayed.append(mncore.metrics.counters()["replays"] == before + 1)
        return Run([_to_cpu(l) for l in losses], _to_cpu(model.state_dict()), _opt_state(opt)), replayed

    before = mncore.metrics.counters()
    cap, replayed = run("capture")
    d = _delta(before, "captures", "replays")
    if where == "after_backward":
        # calls 3 and 5 fail; 4 and 6 record afresh, 7 agrees with 6, and 8..12 replay
        assert replayed == [False] * 7 + [True] * 5
        assert d == {"captures": 5, "replays": 5}
    else:
        # a failure after zero_grad() leaves every .grad None, so calls 4 and 6 have the key of step 1
        # (4 records, 6 agrees with it); the steady-state key lost its recording at 3 and at 5, so 7
        # records afresh, 8 agrees, 9..12 replay
        assert replayed == [False] * 8 + [True] * 4
        assert d == {"captures": 6, "replays": 4}
    lazy, _ = run("lazy")
    _assert_identical(cap, lazy)
    eager, _ = run("eager")
    _assert_close(cap, eager)


# ---------------------------------------------------------------------------------------------- 10. outputs


def test_outputs_and_grads_read_after_replays_are_right():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(16, 8, batch=8)

    def run(mode: str):
        dev = "cpu" if mode == "eager" else "mncore"
        model = copy.deepcopy(base).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y):
            opt.zero_grad()  # set_to_none: each step makes new .grad tensors
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            return {"loss": loss, "pair": (logits, x), "n": 7}

        fn = mncore.capture(step) if mode == "capture" else step
        outs, grads, held, replayed = [], [], [], []
        for i, b in enumerate(batches):
            before = mncore.metrics.counters()["replays"]
            x = b["x"].to(dev)
            out = fn(x, b["y"].to(dev))
            if mode == "lazy":
                mncore.sync()
            replayed.append(mncore.metrics.counters()["replays"] == before + 1)
            assert set(out) == {"loss", "pair", "n"} and isinstance(out["pair"], tuple) and out["n"] == 7
            assert out["pair"][1] is x  # an argument returned is the argument itself
            if replayed[-1]:
                assert out["loss"].grad_fn is None and not out["loss"].requires_grad
            outs.append(_to_cpu({"loss": out["loss"], "logits": out["pair"][0]}))
            grads.append([_to_cpu(p.grad) for p in model.parameters()])
            if i % 2 == 0:  # keep these .grad tensors alive: the next replay must not write into them
                held.append((i, [p.grad for p in model.parameters()]))
        return outs, grads, held, replayed

    cap_outs, cap_grads, cap_held, replayed = run("capture")
    assert replayed == [False] * 3 + [True] * 5
    lazy_outs, lazy_grads, _, _ = run("lazy")
    eager_outs, eager_grads, _, _ = run("eager")
    for i in range(len(batches)):
        for k in ("loss", "logits"):
            assert torch.equal(cap_outs[i][k], lazy_outs[i][k]), (i, k)
            torch.testing.assert_close(cap_outs[i][k], eager_outs[i][k])
        for g, h, e in zip(cap_grads[i], lazy_grads[i], eager_grads[i]):
            assert torch.equal(g, h), i
            torch.testing.assert_close(g, e)
    for i, gs in cap_held:  # read at the end, after every later replay
        for g, want in zip(gs, cap_grads[i]):
            assert torch.equal(g.cpu(), want), i


# ---------------------------------------------------------------------------------------------- 11. buffers


def test_live_buffers_stay_flat_over_500_replays():
    mncore.init_cpu(implicit_sync="error", execution="async")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)).mncore()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 8).mncore(), torch.randint(0, 10, (8,)).mncore()

    @mncore.capture(check_every=0)
    def step(inp, target):
        opt.zero_grad()
        loss = F.cross_entropy(model(inp), target)
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):  # three recordings, two replays
        step(x, y)
    mncore.wait_device_ops()
    gc.collect()  # garbage left by earlier tests in this process; the loop itself needs no collection
    warm = mncore.metrics.counters()["live_buffers"]
    before = mncore.metrics.counters()["replays"]
    seen = set()
    for i in range(500):
        step(x, y)
        if i % 50 == 49:
            mncore.wait_device_ops()
            seen.add(mncore.metrics.counters()["live_buffers"])
    assert mncore.metrics.counters()["replays"] - before == 500
    assert seen == {warm}
    # and the 500 replays trained the model: same as 505 lazy steps from the same start
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 10)).mncore()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01, momentum=0.9)
    for _ in range(505):
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        mncore.sync()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.cpu(), q.cpu())


# ---------------------------------------------------------------------------------------------- 12. re-validation

def _call_log(fn: Callable, arg: Any, calls: int, before: Callable[[int], None]) -> tuple[list, list[bool], list[int], list[str]]:
    """``fn(arg)`` ``calls`` times, ``before(call)`` ahead of each: the outputs on the CPU, whether each call
    replayed, the calls that gave a new CaptureWarning, and the warnings."""
    outs, replayed, warned_at = [], [], []
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for call in range(1, calls + 1):
            before(call)
            replays = mncore.metrics.counters()["replays"]
            n_warn = len(_capture_warnings(rec))
            outs.append(fn(arg).cpu())
            replayed.append(mncore.metrics.counters()["replays"] == replays + 1)
            if len(_capture_warnings(rec)) > n_warn:
                warned_at.append(call)
    return outs, replayed, warned_at, _capture_warnings(rec)


SCALE = 1.0


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_periodic_revalidation_catches_a_hidden_python_number(how: str, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 1.0)  # restored after the test
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(cpu_model).mncore()
    x = torch.randn(5, 8)
    xd = x.mncore()

    def predict(inp):
        with torch.no_grad():
            return model(inp) * SCALE  # revalidation:scale

    if how == "argument":
        fn = mncore.capture(check_every=3)(predict)
    else:
        monkeypatch.setenv("MNCORE_CAPTURE_CHECK", "3")
        fn = mncore.capture(predict)
    scales: list[float] = []

    def before(call: int) -> None:
        global SCALE
        if call == 4:
            SCALE = 2.5  # capture cannot see this: calls 4 and 5 replay; call 6 re-validates
        scales.append(SCALE)

    reasons = mncore.metrics.capture_retraces()
    outs, replayed, warned_at, msgs = _call_log(fn, xd, 12, before)
    assert warned_at == [6] and len(msgs) == 1
    assert "Python number" in msgs[0] and "1.0" in msgs[0] and "2.5" in msgs[0], msgs[0]
    assert _line("revalidation:scale") in msgs[0]
    # 1, 2 record; 3 re-validates (agrees); 4, 5 replay; 6 re-validates and refuses; 7, 8 are traced;
    # 9 (due again) records afresh, agrees with 6; then replays with the new value
    assert replayed == [False, False, False, True, True, False, False, False, False, True, True, False]
    assert any("re-validation" in why for why in _new_reasons(reasons))
    with torch.no_grad():
        for call, (scale, out) in enumerate(zip(scales, outs), start=1):
            if call in (4, 5):
                continue  # replayed before the change could be seen (that is what re-validation bounds)
            lazy = model(xd) * scale
            mncore.sync()
            assert torch.equal(out, lazy.cpu()), call
            torch.testing.assert_close(out, cpu_model(x) * scale)


OFFSET = 0.5  # the value of the host scalar the step below makes on every call


def _run_host_scalar_step(calls: int, change_at: int | None) -> tuple[list, list[bool], list[int], list[str], list]:
    """A step that makes a host scalar tensor on every call (as transformers' attention-mask code does),
    with re-validation every 3 calls; ``OFFSET`` becomes 1.5 before call ``change_at``. Returns the
    outputs, which calls replayed, the calls that warned, the warnings and the expected outputs."""
    torch.manual_seed(0)
    x = torch.randn(6)
    xd = x.mncore()

    def step(inp):
        return inp * 2 + torch.tensor(OFFSET)  # host-scalar:offset

    offsets: list[float] = []

    def before(call: int) -> None:
        global OFFSET
        if call == change_at:
            OFFSET = 1.5
        offsets.append(OFFSET)

    outs, replayed, warned_at, msgs = _call_log(mncore.capture(check_every=3)(step), xd, calls, before)
    return outs, replayed, warned_at, msgs, [x * 2 + o for o in offsets]


def test_a_host_scalar_made_alike_on_every_call_stays_a_constant_through_re_validation(monkeypatch):
    """Two recordings that made equal scalar host tensors turn them into a constant; a re-validation
    makes the tensor again and must compare it with that constant, not refuse (GPT-2 stopped
    replaying for good at its 100th call)."""
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 0.5)
    outs, replayed, warned_at, msgs, want = _run_host_scalar_step(12, None)
    assert warned_at == [] and msgs == []
    # 1, 2 record; 3, 6, 9, 12 re-validate (and agree); the others replay
    assert replayed == [False, False, False, True, True, False, True, True, False, True, True, False]
    for out, ref in zip(outs, want):
        torch.testing.assert_close(out, ref)


def test_check_next_makes_the_next_call_a_re_validation():
    torch.manual_seed(0)
    x = torch.randn(6)
    w = torch.randn(6).mncore()
    fn = mncore.capture(check_every=0)(lambda inp: inp * w + 1)
    kinds = []
    for call in range(1, 8):
        if call == 5:
            fn.check_next()
        before = mncore.metrics.counters()
        out = fn(x.mncore())
        d = _delta(before, "captures", "replays")
        kinds.append("replay" if d == {"captures": 0, "replays": 1} else "record" if d["captures"] == 1 else d)
        torch.testing.assert_close(out.cpu(), x * w.cpu() + 1)
    # 1, 2 record and agree; 3, 4 replay; 5 records again (agrees); 6, 7 replay
    assert kinds == ["record", "record", "replay", "replay", "record", "replay", "replay"]


def test_re_validation_refuses_a_host_scalar_whose_value_changed(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 0.5)
    outs, replayed, warned_at, msgs, want = _run_host_scalar_step(9, change_at=4)
    # calls 4 and 5 replay the old value (what re-validation bounds); call 6 re-validates and refuses;
    # 7, 8 are traced; 9 (due again) records afresh, and the new value is made anew compared with call 6's
    assert warned_at == [6] and len(msgs) == 1, msgs
    assert "holds another value" in msgs[0] and _line("host-scalar:offset") in msgs[0], msgs[0]
    assert replayed == [False, False, False, True, True, False, False, False, False]
    for call, (out, ref) in enumerate(zip(outs, want), start=1):
        if call not in (4, 5):
            torch.testing.assert_close(out, ref)


# ---------------------------------------------------------------------------------------------- 13. sync inside


def test_sync_inside_the_captured_function_is_deferred_and_right():
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    batches = _mlp_batches(16, 8, batch=8)

    def loss_with_sync(model, b):
        loss = _ce(model, b)
        mncore.sync()  # the user's habit: a sync per step, here in the middle of it
        return loss

    before = mncore.metrics.counters()
    graphs = []

    def counting(fn):
        step = mncore.capture(fn)

        def call(b):
            mncore.wait_device_ops()
            n = mncore.metrics.counters()["graphs_executed"]
            out = step(b)
            mncore.wait_device_ops()
            graphs.append(mncore.metrics.counters()["graphs_executed"] - n)
            return out
        return call

    sgd = lambda p, dev: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    cap = _train(base, batches, "capture", sgd, loss_with_sync, capture=counting)
    d = _delta(before, "captures", "replays")
    assert d["captures"] == 3 and d["replays"] == 5
    assert graphs == [1] * 8  # recorded or replayed, each step is one graph: the inner sync waited for the end
    lazy = _train(base, batches, "lazy", sgd, loss_with_sync)
    _assert_identical(cap, lazy)
    eager = _train(base, batches, "eager", sgd, lambda m, b: _ce(m, b))
    _assert_close(cap, eager)


# ---------------------------------------------------------------------------------------------- API


def test_capture_forms_and_bad_arguments():
    def f(x):
        return x * 2

    assert isinstance(mncore.capture(f), Captured)
    wrapped = mncore.capture(check_every=5, strict=True, max_entries=2)(f)
    assert wrapped.check_every == 5 and wrapped.strict and wrapped.max_entries == 2
    assert wrapped.__name__ == "f"
    with pytest.raises(TypeError):
        mncore.capture(3)
    with pytest.raises(ValueError):
        mncore.capture(f, max_entries=0)
    with pytest.raises(ValueError):
        mncore.capture(f, check_every=-1)
    x = torch.arange(4.0)
    before = mncore.metrics.counters()["replays"]
    outs = [wrapped(x.mncore()) for _ in range(4)]
    assert mncore.metrics.counters()["replays"] - before == 2
    for o in outs:
        torch.testing.assert_close(o.cpu(), x * 2)


def test_call_structure_walks_arguments_in_pytree_order():
    """The call key's own walk of tuples, lists and dicts gives pytree's leaves in pytree's order (replays
    bind arguments by position), hands other containers to pytree, and tells structures apart."""
    from collections import OrderedDict, namedtuple

    from torch.utils import _pytree as pytree

    from mncore.capture.api import _flatten

    Pair = namedtuple("Pair", "a b")
    x, y, z = torch.ones(1), torch.zeros(2), torch.ones(3)
    tree = ((x, [y, {"k": z, "n": 3}], Pair(y, 1.5), OrderedDict(q=x)), {"lr": None, "name": "s"})
    leaves: list = []
    structure = _flatten(tree, leaves)
    expected, _ = pytree.tree_flatten(tree)
    assert len(leaves) == len(expected) and all(a is b for a, b in zip(leaves, expected))

    def structure_of(t):
        return _flatten(t, [])

    assert structure_of(tree) == structure
    assert structure_of(((x, y), {})) != structure_of(([x, y], {}))  # a list is not a tuple
    assert structure_of(({"a": x, "b": y},)) != structure_of(({"b": y, "a": x},))  # keys in order, as pytree
    assert structure_of((Pair(x, y),)) != structure_of(((x, y),))
