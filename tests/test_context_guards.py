"""The Context API where one compiled graph is not the whole story: values read on the host inside the
function (guards, variants, their bound), weakly referenced weights, and data-dependent shapes."""
from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from mncore import config
from mncore.context import Context, MNCoreSGD, MNDevice, set_buffer_name_in_optimizer, set_tensor_name_in_module
from mncore.errors import GuardError, NotCompilableError
from tests.helpers import dict_train_step, doubling_with_backward

pytestmark = pytest.mark.unit
RTOL, ATOL = 1e-5, 1e-6  # float32: same kernels, only summation order may differ


@pytest.fixture
def ctx():
    """A fresh context; afterwards a fresh empty one becomes current, so its values go back to the host."""
    context = Context(MNDevice("pfvm:cpu"))
    yield context
    Context.switch_context(Context(MNDevice("pfvm:cpu")))


def _registered(ctx: Context, model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> None:
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)
    if opt is not None:
        set_buffer_name_in_optimizer(opt, "opt")
        ctx.register_optimizer_buffers(opt)


def _masked_step(model: torch.nn.Module, opt: torch.optim.Optimizer):
    """A training step that branches on a host read of its mask, as transformers' attention-mask checks do."""
    def step(batch: dict) -> dict:
        opt.zero_grad()
        h = model(batch["x"])
        if (batch["mask"] == 0).any():  # the host read: a guard
            h = h.masked_fill(batch["mask"] == 0, 0.0)
        else:
            h = h * 0.5
        loss = F.cross_entropy(h, batch["y"])
        loss.backward()
        opt.step()
        return {"loss": loss}
    return step


def _batches(masks: list[bool]) -> list[dict]:
    g = torch.Generator().manual_seed(3)
    out = []
    for has_zero in masks:
        mask = torch.ones(6, 3)
        if has_zero:
            mask[1, 2] = 0
        out.append({"x": torch.randn(6, 4, generator=g), "y": torch.randint(0, 3, (6,), generator=g), "mask": mask})
    return out


def _models():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, copy.deepcopy(model)


def test_changed_branch_recompiles_and_trains_like_eager(ctx, tmp_path):
    """The branch flips at every call: each call runs the variant of its own branch, the state only ever
    takes the right variant's update (a wrong variant's run is discarded), and the variants stay two."""
    model, ref = _models()
    opt, ref_opt = MNCoreSGD(model.parameters(), lr=0.5, momentum=0.9), torch.optim.SGD(ref.parameters(), lr=0.5,
                                                                                       momentum=0.9)
    _registered(ctx, model, opt)
    batches = _batches([False, True, False, True, True])
    compiled = ctx.compile(_masked_step(model, opt), batches[0], tmp_path / "step")
    manifest = json.loads((tmp_path / "step" / "manifest.json").read_text())
    assert [g["read"] for g in manifest["guards"]] == [".item()/bool()/float()"]
    assert manifest["guards"][0]["site"].startswith(__file__)
    losses = [compiled(b)["loss"].item() for b in batches]
    ref_step = _masked_step(ref, ref_opt)
    expected = [ref_step(b)["loss"].item() for b in batches]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=RTOL, atol=ATOL)
    ctx.synchronize()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")
    assert len(compiled.variants) == 2
    assert (tmp_path / "step" / "variant1" / "manifest.json").exists()


def test_changed_guard_past_the_bound_raises_naming_the_read(ctx, tmp_path):
    """MNCORE_CONTEXT_VARIANTS=1: a changed guard is an error naming the read and its line; the call did
    not run (the state is untouched) and a call matching the compiled branch still works."""
    model, ref = _models()
    opt = MNCoreSGD(model.parameters(), lr=0.5)
    _registered(ctx, model, opt)
    ok, flipped = _batches([False, True])
    compiled = ctx.compile(_masked_step(model, opt), ok, tmp_path / "step")
    with config.override(context_variants=1), pytest.raises(GuardError) as err:
        compiled(flipped)
    msg = str(err.value)
    assert "bool()" in msg and f"{__file__}:" in msg and "in step" in msg, msg
    assert "compiled for False, got True" in msg and "MNCORE_CONTEXT_VARIANTS=1" in msg, msg
    ctx.synchronize()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)  # nothing ran: bit-identical to the initial weights
    compiled(ok)
    ctx.synchronize()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    _masked_step(ref, ref_opt)(ok)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL)


def test_item_of_an_input_is_guarded_with_bounded_variants(ctx, tmp_path):
    """A scalar read with .item() and used in the graph: each new value is a variant, up to the bound."""
    def scale_by_item(i: dict) -> dict:
        return {"out": i["x"] * i["s"].item()}

    x = torch.randn(3)
    compiled = ctx.compile(scale_by_item, {"x": x, "s": torch.tensor(2.0)}, tmp_path / "item")
    with config.override(context_variants=3):
        for s in (5.0, 2.0, -1.5, 5.0):
            torch.testing.assert_close(compiled({"x": x, "s": torch.tensor(s)})["out"].cpu(), x * s)
        assert len(compiled.variants) == 3
        with pytest.raises(GuardError, match=r"\.item\(\).*compiled for"):
            compiled({"x": x, "s": torch.tensor(7.0)})


def test_unguarded_function_stays_asynchronous_with_one_variant(ctx, tmp_path):
    compiled = ctx.compile(lambda i: {"y": i["x"] * 2}, {"x": torch.randn(3)}, tmp_path / "plain")
    x = torch.randn(3)
    torch.testing.assert_close(compiled({"x": x})["y"].cpu(), x * 2)
    assert len(compiled.variants) == 1 and compiled.variants[0].guards == []


class _LSTMRegressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(4, 5, batch_first=True)
        self.head = torch.nn.Linear(5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


def test_weakly_referenced_lstm_weights_compile_and_train_like_eager(ctx, tmp_path):
    """nn.LSTM keeps weak references to its weights (swap_tensors refuses them): they are substituted
    while tracing; training matches eager and the module, optimizer and weak references are the host's again."""
    torch.manual_seed(0)
    model = _LSTMRegressor()
    ref = copy.deepcopy(model)
    opt = MNCoreSGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    _registered(ctx, model, opt)
    weight = model.rnn.weight_ih_l0
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(2, 3, 4, generator=g), "y": torch.randn(2, 1, generator=g)} for _ in range(3)]
    compiled = ctx.compile(dict_train_step(model, opt, F.mse_loss), batches[0], tmp_path / "lstm")
    losses = [compiled(b)["loss"].item() for b in batches]
    ref_step = dict_train_step(ref, ref_opt, F.mse_loss)
    expected = [ref_step(b)["loss"].item() for b in batches]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=RTOL, atol=ATOL)
    ctx.synchronize()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}")
    assert model.rnn.weight_ih_l0 is weight and type(weight) is torch.nn.Parameter
    assert opt.param_groups[0]["params"][0] is weight and weight in opt.state
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(model(x), ref(x), rtol=RTOL, atol=ATOL)  # the host module works eagerly again


def test_data_dependent_shape_is_not_compilable(ctx, tmp_path):
    model, _ = _models()
    _registered(ctx, model)

    def route(i: dict) -> dict:
        h = model(i["x"])
        return {"picked": h[h.sum(1) > 0].sum()}  # boolean indexing: its shape depends on values

    with pytest.raises(NotCompilableError, match=r"guards\.py:\d+ in route: its output shape is not known") as info:
        ctx.compile(route, {"x": torch.randn(5, 4)}, tmp_path / "route")
    # the way out comes before PyTorch's own (long) explanation, so a report that cuts the message keeps it
    message = str(info.value)
    assert message.index("run the step in lazy mode") < message.index("(PyTorch: ")
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"


def test_data_dependent_shape_in_backward_is_not_compilable_too(ctx, tmp_path):
    """The same refusal when the op is in backward (``hf_speecht5``'s boolean-mask ``index``): autograd turns
    an error in backward into a ``RuntimeError`` of its own; the Context API raises the op's error instead."""
    model, _ = _models()
    _registered(ctx, model)

    PositiveOnly = doubling_with_backward(lambda g: g * g[g > 0].numel())  # boolean indexing: value-dependent shape

    def step(i: dict) -> dict:
        loss = PositiveOnly.apply(model(i["x"])).sum()
        loss.backward()
        return {"loss": loss}

    with pytest.raises(NotCompilableError, match=r"index\.Tensor at .*: its output shape is not known") as info:
        ctx.compile(step, {"x": torch.randn(5, 4)}, tmp_path / "step")
    assert "Unable to cast" not in str(info.value)
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"


class _RunningPeak(torch.nn.Module):
    """Tracks its largest activation by rebinding a buffer (``self.peak = ...``), as transformers' I-BERT
    keeps its activation ranges, instead of writing into it."""

    def __init__(self, peak_shape: tuple = (1,)):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.peak = torch.nn.Buffer(torch.zeros(1))
        self.peak_shape = peak_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        self.peak = torch.maximum(self.peak * 0.9, h.detach().abs().amax().expand(self.peak_shape))
        return h * self.peak


def _with_buffers(ctx: Context, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    _registered(ctx, model, opt)
    for b in model.buffers():
        ctx.register_buffer(b)


def test_a_rebound_buffer_becomes_a_state_update_and_stays_the_registered_tensor(ctx, tmp_path):
    """A step that replaces a registered buffer (``self.peak = f(self.peak)``) compiles: each call updates
    the buffer as eager training does, and the module keeps the registered tensor object in its slot."""
    torch.manual_seed(0)
    model = _RunningPeak()
    ref = copy.deepcopy(model)
    opt = MNCoreSGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    _with_buffers(ctx, model, opt)
    peak = model.peak
    g = torch.Generator().manual_seed(2)
    batches = [{"x": torch.randn(5, 4, generator=g) * (1 + i), "y": torch.randn(5, 3, generator=g)} for i in range(3)]
    compiled = ctx.compile(dict_train_step(model, opt, F.mse_loss), batches[0], tmp_path / "peak")
    assert model.peak is peak and model._buffers["peak"] is peak
    losses = [compiled(b)["loss"].item() for b in batches]
    ref_step = dict_train_step(ref, ref_opt, F.mse_loss)
    expected = [ref_step(b)["loss"].item() for b in batches]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=RTOL, atol=ATOL)
    ctx.synchronize()
    assert model.peak is peak
    torch.testing.assert_close(model.peak, ref.peak, rtol=RTOL, atol=ATOL)
    assert ref.peak.item() > 0  # the statistic moved: the check above is not of two untouched zeros


def test_a_buffer_rebound_to_another_shape_is_not_compilable_and_the_module_is_restored(ctx, tmp_path):
    model = _RunningPeak(peak_shape=(3,))
    opt = MNCoreSGD(model.parameters(), lr=0.1)
    _with_buffers(ctx, model, opt)
    peak, before = model.peak, model.peak.clone()
    batch = {"x": torch.randn(5, 4), "y": torch.randn(5, 3)}
    with pytest.raises(NotCompilableError, match=r"replaces the registered tensor 'model\.peak' \(torch\.float32, "
                                                 r"shape \[1\]\) with a torch\.float32 tensor of shape \[3\]"):
        ctx.compile(dict_train_step(model, opt, F.mse_loss), batch, tmp_path / "peak")
    assert model.peak is peak and peak.device.type == "cpu"
    torch.testing.assert_close(peak, before, rtol=0, atol=0)  # untouched (a copy, not computed: exact is right)


@pytest.mark.parametrize("write", ["copy_", "index", "out=", "add_"])
def test_a_write_into_an_unregistered_host_tensor_is_refused_at_compile(ctx, tmp_path, write):
    """A compiled call runs no Python, so a write into a host tensor that is not registered would happen at
    compile time only: later calls would leave it unchanged without a word. Every way of writing raises when
    compiling, naming the op and the fix; the value returned and copied after the call is right."""
    host = torch.zeros(4)
    writes = {"copy_": lambda v: host.copy_(v), "index": lambda v: host.__setitem__(slice(0, 2), v[:2]),
              "out=": lambda v: torch.mul(v, 1.0, out=host), "add_": lambda v: host.add_(v)}

    def fn(i: dict) -> dict:
        writes[write](i["x"] * 2)
        return {"y": i["x"] + 1}

    with pytest.raises(RuntimeError, match=r"writes into the unregistered host tensor.*register"):
        ctx.compile(fn, {"x": torch.ones(4)}, tmp_path / "write")
    compiled = ctx.compile(lambda i: {"twice": i["x"] * 2}, {"x": torch.ones(4)}, tmp_path / "returned")
    for x in (torch.full((4,), 3.0), torch.arange(4.0)):
        host.copy_(compiled({"x": x})["twice"].cpu())
        torch.testing.assert_close(host, x * 2)
