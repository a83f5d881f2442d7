"""The Context API (``mncore.context``) against eager PyTorch on CPU and against lazy mode.

Every numerical check recomputes the expected value eagerly on CPU in the same test (same
seed, same data). Each test uses its own ``Context(MNDevice("pfvm:cpu"))``.
"""
from __future__ import annotations

import copy
import gc
import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mncore
from mncore.context import (
    CacheOptions, CompiledFunction, Context, InputError, MNCoreAdamW, MNCoreSGD, MNDevice, TensorProxy,
    set_buffer_name_in_optimizer, set_tensor_name, set_tensor_name_in_module, storage,
)
from tests.helpers import dict_train_step, eager_seed_mlp_train, train

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-6  # float32: same kernels, only summation order may differ


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str = "", rtol: float = RTOL,
                  atol: float = ATOL) -> None:
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.fixture
def ctx():
    """A fresh context; afterwards a fresh empty one becomes current, so its values go back to the host."""
    context = Context(MNDevice("pfvm:cpu"))
    yield context
    Context.switch_context(Context(MNDevice("pfvm:cpu")))


def _add(inputs: dict) -> dict:
    return {"out": inputs["x"] + inputs["y"]}


def _add_sample() -> dict:
    return {"x": torch.randn(3, 4), "y": torch.randn(3, 4)}


def _check_add(compiled: CompiledFunction) -> None:
    """A good call after an error still gives the right value."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    _assert_close(compiled({"x": x, "y": y})["out"].cpu(), x + y, "add after an error")


# ---------------------------------------------------------------------------------------------
# 1. the seed's example programs, only the import line changed


@pytest.fixture(scope="module")
def example_runs() -> dict:
    """Run both examples concurrently (one subprocess each) and collect (returncode, stdout, stderr)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    procs = {
        name: subprocess.Popen([sys.executable, f"examples/context/{name}.py"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("add", "mlp_train")
    }
    out = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        out[name] = (p.returncode, stdout, stderr)
    return out


def test_example_add_runs(example_runs):
    rc, stdout, stderr = example_runs["add"]
    assert rc == 0, stderr
    assert "result_on_cpu=tensor(" in stdout
    body = stdout.split("result_on_cpu=tensor(", 1)[1]
    values = [float(v) for v in re.findall(r"-?\d+\.\d*", body)]
    assert values == [2.0] * 12, stdout


def _parse_mlp_output(stdout: str) -> tuple[float, torch.Tensor]:
    m = re.search(r"^last loss (\S+)$", stdout, re.M)
    assert m, stdout
    assert "Parameter containing:" in stdout and "requires_grad=True" in stdout, stdout
    body = stdout.split("Parameter containing:", 1)[1]
    bias = torch.tensor([float(v) for v in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", body)])
    return float(m.group(1)), bias


def test_example_mlp_train_runs(example_runs):
    rc, stdout, stderr = example_runs["mlp_train"]
    assert rc == 0, stderr
    loss, bias = _parse_mlp_output(stdout)
    assert bias.shape == (10,)
    assert torch.isfinite(torch.tensor(loss)) and torch.isfinite(bias).all()


def test_example_mlp_train_matches_eager(example_runs):
    """The program's printed last loss and model[2].bias equal the same loop run eagerly."""
    rc, stdout, stderr = example_runs["mlp_train"]
    assert rc == 0, stderr
    loss, bias = _parse_mlp_output(stdout)
    # The example's program, eagerly (nothing between the loader and the model draws random numbers).
    eager_loss, eager_bias = eager_seed_mlp_train()
    assert loss == pytest.approx(eager_loss, rel=1e-5)
    # printed with 4 decimals
    _assert_close(bias, eager_bias, "printed model[2].bias", rtol=0, atol=1e-4 + 1e-6)


# ---------------------------------------------------------------------------------------------
# 2 + 6. training through a compiled step == eager == lazy; synchronize() writes back


def _mlp() -> torch.nn.Sequential:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batches(n: int = 5, seed: int = 1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(8, 16, generator=g), "y": torch.randint(0, 4, (8,), generator=g)} for _ in range(n)]


def _ce(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


# (optimizer used in the compiled step, the eager/lazy optimizer with identical maths)
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    "mncore_sgd_momentum": (lambda p: MNCoreSGD(p, lr=0.1, momentum=0.9),
                            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0)),
    "mncore_adamw": (lambda p: MNCoreAdamW(p, lr=1e-2, weight_decay=1e-2),
                     lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1e-2)),
}


def _context_train(context: Context, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list,
                   codegen_dir: Path) -> tuple[list[float], CompiledFunction]:
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        context.register_param(p)
    for b in model.buffers():
        context.register_buffer(b)
    set_buffer_name_in_optimizer(opt, "opt")
    context.register_optimizer_buffers(opt)

    train_step = dict_train_step(model, opt)

    step = context.compile(train_step, batches[0], codegen_dir)
    losses = [step(b)["loss"] for b in batches]
    return [l.item() for l in losses], step


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compiled_training_matches_eager_and_lazy(ctx, tmp_path, opt_name):
    make_ctx_opt, make_ref_opt = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    base = _mlp()
    batches = _batches()
    tuples = [(b["x"], b["y"]) for b in batches]
    eager_losses, eager_state = train(base, tuples, "cpu", make_ref_opt, _ce)
    lazy_losses, lazy_state = train(base, tuples, "mncore", make_ref_opt, _ce)

    model = copy.deepcopy(base)
    opt = make_ctx_opt(model.parameters())
    losses, _ = _context_train(ctx, model, opt, batches, tmp_path / "train")
    ctx.synchronize()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    assert all(v.device.type == "cpu" for v in state.values())

    _assert_close(torch.tensor(losses), torch.tensor(eager_losses), "per-step losses vs eager")
    _assert_close(torch.tensor(losses), torch.tensor(lazy_losses), "per-step losses vs lazy")
    assert state.keys() == eager_state.keys()
    for k in state:
        _assert_close(state[k], eager_state[k], f"{k} vs eager")
        _assert_close(state[k], lazy_state[k], f"{k} vs lazy")


@pytest.mark.parametrize("where", ["caller", "worker"])
def test_state_values_a_call_replaces_are_freed(ctx, tmp_path, where):
    """Each call replaces the registered state (here 4 parameters and 4 momentum buffers); the values it
    replaced must be freed, whether the graph runs on the calling thread (inside submit) or on the worker.
    They were kept alive as a chain of fallbacks when the graph had run before the call committed them."""
    torch.manual_seed(0)
    model = _mlp()
    opt = MNCoreSGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = _batches(4)
    with mncore.config.override(cpu_thread=where):
        _, step = _context_train(ctx, model, opt, batches, tmp_path / "train")
        mncore.wait_device_ops()
        gc.collect()  # earlier tests' garbage (cycles holding device tensors) is not freed inside the window
        warm = mncore.metrics.counters()["live_buffers"]
        for i in range(40):
            step(batches[i % len(batches)])
        mncore.wait_device_ops()
    assert mncore.metrics.counters()["live_buffers"] == warm


def test_synchronize_writes_trained_values_to_host(ctx, tmp_path, capsys):
    torch.manual_seed(0)
    base = _mlp()
    batches = _batches(3)
    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for b in batches:
        ref_opt.zero_grad()
        _ce(ref, b["x"], b["y"]).backward()
        ref_opt.step()

    model = copy.deepcopy(base)
    _context_train(ctx, model, torch.optim.SGD(model.parameters(), lr=0.1), batches, tmp_path / "train")
    ctx.synchronize()
    print(model[2].bias)
    printed = capsys.readouterr().out
    assert printed.startswith("Parameter containing:") and "mncore" not in printed, printed
    assert type(model[2].bias) is torch.nn.Parameter and model[2].bias.device.type == "cpu"
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        _assert_close(p.detach(), q.detach(), f"host {name} after synchronize()")
    assert not torch.equal(model[2].bias.detach(), base[2].bias.detach()), "parameters did not change"


def test_synchronize_writes_loaded_registered_value_to_host(ctx, tmp_path):
    """Write-back path without training: a registered value replaced on the device reaches the host."""
    w = torch.nn.Parameter(torch.zeros(4, 2))
    set_tensor_name(w, "lin.w")
    ctx.register_param(w)
    compiled = ctx.compile(lambda i: {"out": i["x"] @ w}, {"x": torch.zeros(3, 4)}, tmp_path / "mm")
    new = torch.randn(4, 2)
    ctx.get_registered_value_proxy(w).load_from(new)
    x = torch.randn(3, 4)
    _assert_close(compiled({"x": x})["out"].cpu(), x @ new, "x @ w")
    assert torch.equal(w.detach(), torch.zeros(4, 2)), "host value changed before synchronize()"
    ctx.synchronize()
    assert type(w) is torch.nn.Parameter and w.device.type == "cpu" and w.requires_grad
    assert torch.equal(w.detach(), new)


def test_in_place_update_of_registered_tensor_persists(ctx, tmp_path):
    """An in-place update of a registered tensor inside the compiled function persists across calls."""
    w = torch.nn.Parameter(torch.zeros(3))
    set_tensor_name(w, "w")
    ctx.register_param(w)

    def accumulate(i: dict) -> dict:
        with torch.no_grad():
            w.add_(i["x"])
        return {"w_times_2": w * 2}

    compiled = ctx.compile(accumulate, {"x": torch.zeros(3)}, tmp_path / "acc")
    x = torch.tensor([1.0, 2.0, 3.0])
    outs = [compiled({"x": x})["w_times_2"].cpu() for _ in range(3)]
    for k, out in enumerate(outs, start=1):
        _assert_close(out, 2 * k * x, f"call {k}")
    ctx.synchronize()
    _assert_close(w.detach(), 3 * x, "host w")


# ---------------------------------------------------------------------------------------------
# 3. no retracing


def test_thousand_calls_trace_nothing_and_compile_once(ctx, tmp_path):
    def fn(i: dict) -> dict:
        return {"out": i["x"] * 2 + i["y"]}

    sample = {"x": torch.zeros(7, 13), "y": torch.zeros(7, 13)}
    before = mncore.metrics.counters()
    compiled = ctx.compile(fn, sample, tmp_path / "tiny")
    after_compile = mncore.metrics.counters()
    assert after_compile["compiles"] - before["compiles"] == 1
    x, y = torch.randn(7, 13), torch.randn(7, 13)
    for _ in range(1000):
        out = compiled({"x": x, "y": y})
    _assert_close(out["out"].cpu(), x * 2 + y, "out")
    end = mncore.metrics.counters()
    assert end["traced_ops"] == after_compile["traced_ops"]
    assert end["compiles"] == after_compile["compiles"]
    assert end["graphs_executed"] - after_compile["graphs_executed"] == 1000


# ---------------------------------------------------------------------------------------------
# 4. errors name the problem, and the process keeps working


def test_missing_input_key(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    with pytest.raises(KeyError) as e:
        compiled({"x": torch.randn(3, 4)})
    assert isinstance(e.value, InputError)
    assert "y is not in inputs" in str(e.value)
    _check_add(compiled)


def test_extra_input_key(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    with pytest.raises(InputError, match=r"unexpected input key\(s\) 'z'"):
        compiled({"x": torch.randn(3, 4), "y": torch.randn(3, 4), "z": torch.randn(3, 4)})
    _check_add(compiled)


def test_shape_mismatch(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    with pytest.raises(ValueError) as e:
        compiled({"x": torch.randn(3, 4), "y": torch.randn(2, 4)})
    msg = str(e.value)
    assert "'y'" in msg and "[3, 4]" in msg and "[2, 4]" in msg, msg
    _check_add(compiled)


def test_dtype_mismatch(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    with pytest.raises(ValueError) as e:
        compiled({"x": torch.randn(3, 4, dtype=torch.float64), "y": torch.randn(3, 4)})
    msg = str(e.value)
    assert "'x'" in msg and "torch.float32" in msg and "torch.float64" in msg, msg
    _check_add(compiled)


def test_call_with_non_dict(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    with pytest.raises(TypeError, match="dict"):
        compiled([torch.randn(3, 4), torch.randn(3, 4)])
    with pytest.raises(TypeError, match="'y' must be a torch.Tensor or TensorProxy"):
        compiled({"x": torch.randn(3, 4), "y": 1.0})
    _check_add(compiled)


@pytest.mark.parametrize("bad", [
    pytest.param(lambda i: i["x"] + i["y"], id="tensor"),
    pytest.param(lambda i: [i["x"] + i["y"]], id="list"),
    pytest.param(lambda i: {"out": 1.0}, id="dict-with-float"),
    pytest.param(lambda i: {"out": i["x"] + i["y"], "n": 3}, id="dict-with-int"),
    pytest.param(lambda i: {"out": torch.ones(3, 4)}, id="dict-with-host-tensor"),
])
def test_function_must_return_dict_of_tensors(ctx, tmp_path, bad):
    with pytest.raises(TypeError, match=r"dict\[str, Tensor\]|must be a tensor computed"):
        ctx.compile(bad, _add_sample(), tmp_path / "bad")
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_compile_rejects_bad_sample(ctx, tmp_path):
    with pytest.raises(TypeError, match=r"inputs must be a dict"):
        ctx.compile(_add, [torch.randn(3, 4)], tmp_path / "bad")
    with pytest.raises(TypeError, match=r"inputs\['y'\] must be a torch.Tensor"):
        ctx.compile(_add, {"x": torch.randn(3, 4), "y": 2.0}, tmp_path / "bad")
    with pytest.raises(TypeError, match="cache_options must be a CacheOptions"):
        ctx.compile(_add, _add_sample(), tmp_path / "bad", cache_options="/tmp/cache")
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_unknown_option_lists_known_ones(ctx, tmp_path):
    with pytest.raises(ValueError, match=r"unknown compile option 'dtype'; known options: float_dtype"):
        ctx.compile(_add, _add_sample(), tmp_path / "bad", options={"dtype": "float"})
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_bad_float_dtype(ctx, tmp_path):
    with pytest.raises(ValueError) as e:
        ctx.compile(_add, _add_sample(), tmp_path / "bad", options={"float_dtype": "bfloat"})
    msg = str(e.value)
    assert "float_dtype='bfloat'" in msg and all(v in msg for v in ("float", "mixed", "half", "double")), msg
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add", options={"float_dtype": "float"}))


def test_register_unnamed_tensor(ctx, tmp_path):
    with pytest.raises(ValueError, match=r"unnamed parameter.*set_tensor_name_in_module"):
        ctx.register_param(torch.nn.Parameter(torch.zeros(2)))
    with pytest.raises(ValueError, match=r"unnamed buffer"):
        ctx.register_buffer(torch.zeros(2))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        ctx.register_param([1.0, 2.0])
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_register_same_name_twice(ctx, tmp_path):
    model = torch.nn.Linear(2, 2)
    set_tensor_name_in_module(model, "model")
    ctx.register_param(model.weight)
    with pytest.raises(ValueError, match=r"'model\.weight' is already registered"):
        ctx.register_param(model.weight)
    other = torch.zeros(3)
    set_tensor_name(other, "model.weight")
    with pytest.raises(ValueError, match=r"'model\.weight' is already registered"):
        ctx.register_buffer(other)
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_registered_value_proxy_of_unregistered_tensor(ctx):
    t = torch.zeros(2)
    with pytest.raises(ValueError, match=r"tensor\(shape=\(2,\), dtype=torch.float32\) is not registered"):
        ctx.get_registered_value_proxy(t)
    set_tensor_name(t, "lonely")
    with pytest.raises(ValueError, match="lonely is not registered"):
        ctx.get_registered_value_proxy(t)


@pytest.mark.parametrize("spec", ["tpu", "mncore2:x", "emu3", "pfvm:gpu"])
def test_invalid_device_lists_valid_ones(ctx, tmp_path, spec):
    with pytest.raises(ValueError) as e:
        MNDevice(spec)
    msg = str(e.value)
    assert msg.startswith("MNDevice:") and repr(spec) in msg and "pfvm:cpu" in msg, msg
    with pytest.raises(TypeError):
        Context("pfvm:cpu")
    assert MNDevice("pfvm:cpu").name == "pfvm:cpu"
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_item_inside_compiled_function_is_guarded(ctx, tmp_path):
    """A branch on ``.item()`` takes the branch of each call's own value (tests/test_context_guards.py has
    the guards' bound and errors); tracing leaves the host parameters and the sync mode as they were."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)

    def reads_host(i: dict) -> dict:
        loss = model(i["x"]).sum()
        if loss.item() > 0:  # a host read of a traced value
            loss = loss * 2
        return {"loss": loss}

    mode = mncore.settings.implicit_sync
    x = torch.randn(3, 4)
    compiled = ctx.compile(reads_host, {"x": x}, tmp_path / "item")
    assert mncore.settings.implicit_sync == mode
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"
    assert model.weight.grad is None
    with torch.no_grad():
        assert (model(x).sum() > 0) != (model(-x).sum() > 0)  # the two samples take different branches
    for sample in (x, -x, x):
        with torch.no_grad():
            expected = reads_host({"x": sample})["loss"]
        _assert_close(compiled({"x": sample})["loss"].cpu(), expected, "guarded branch")
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def _plain_adam_step(ctx):
    """A Linear with a plain torch.optim.Adam (state created inside step()), registered in ``ctx``."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ref = copy.deepcopy(model)
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    set_buffer_name_in_optimizer(opt, "opt")
    ctx.register_optimizer_buffers(opt)

    def step(i: dict) -> dict:
        opt.zero_grad()
        loss = model(i["x"]).square().mean()
        loss.backward()
        opt.step()
        return {"loss": loss}

    return model, ref, opt, step


def test_new_optimizer_state_during_compile_is_refused(ctx, tmp_path):
    """Compiling a step whose optimizer creates its state inside step() is refused clearly."""
    model, _, _, step = _plain_adam_step(ctx)
    with pytest.raises(RuntimeError, match="created new optimizer state.*MNCoreSGD/MNCoreAdam/MNCoreAdamW"):
        ctx.compile(step, {"x": torch.randn(3, 4)}, tmp_path / "adam")
    assert type(model.weight) is torch.nn.Parameter and model.weight.device.type == "cpu"
    _check_add(ctx.compile(_add, _add_sample(), tmp_path / "add"))


def test_refused_optimizer_compile_leaves_optimizer_usable(ctx, tmp_path):
    model, ref, opt, step = _plain_adam_step(ctx)
    with pytest.raises(RuntimeError, match="created new optimizer state"):
        ctx.compile(step, {"x": torch.randn(3, 4)}, tmp_path / "adam")
    leaked = [k for st in opt.state.values() for k, v in st.items() if isinstance(v, mncore.LazyTensor)]
    assert not leaked, f"optimizer state left on the device after the refused compile: {leaked}"
    x = torch.randn(3, 4)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    _assert_close(model.weight.detach(), ref.weight.detach(), "eager step after the refused compile")


@pytest.mark.filterwarnings("ignore::mncore.ImplicitSyncWarning")  # pytest's repr of the traceback locals
def test_return_registered_tensor(ctx, tmp_path):
    w = torch.nn.Parameter(torch.randn(3))
    set_tensor_name(w, "w")
    ctx.register_param(w)
    compiled = ctx.compile(lambda i: {"w": w, "y": i["x"] + w}, {"x": torch.zeros(3)}, tmp_path / "ret")
    x = torch.randn(3)
    out = compiled({"x": x})
    _assert_close(out["w"].cpu(), w.detach(), "w")
    _assert_close(out["y"].cpu(), x + w.detach(), "y")




def _leaked(named: list) -> list[str]:
    return [n for n, t in named if isinstance(t, mncore.LazyTensor)]


def test_output_whose_graph_saved_a_registered_buffer(ctx, tmp_path):
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    buf = torch.tensor([2.0, 0.5, -1.0])
    set_tensor_name(w, "w")
    set_tensor_name(buf, "buf")
    ctx.register_param(w)
    ctx.register_buffer(buf)
    try:
        compiled = ctx.compile(lambda i: {"y": i["x"] * w * buf}, {"x": torch.zeros(3)}, tmp_path / "saved")
    except RuntimeError as e:
        assert not _leaked([("w", w), ("buf", buf)]), "the failed compile left w/buf swapped with LazyTensors"
        raise AssertionError(f"compile failed: {e}") from e
    x = torch.randn(3)
    _assert_close(compiled({"x": x})["y"].cpu(), x * w.detach() * buf, "y")


@pytest.mark.parametrize("grad", [
    pytest.param(False, id="no_grad"),
    pytest.param(True, id="grad-enabled"),
])
def test_batchnorm_eval_forward_matches_eager(ctx, tmp_path, grad):
    """An eval step through BatchNorm (eval mode) with registered parameters and buffers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU())
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    model.eval()
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)
    for b in model.buffers():
        ctx.register_buffer(b)

    def eval_step(i: dict) -> dict:
        with torch.set_grad_enabled(grad):
            return {"y": model(i["x"])}

    try:
        compiled = ctx.compile(eval_step, {"x": torch.zeros(5, 4)}, tmp_path / "bn_eval")
    except RuntimeError as e:
        leaked = _leaked([*model.named_parameters(), *model.named_buffers()])
        assert not leaked, f"the failed compile left {leaked} swapped with LazyTensors"
        raise AssertionError(f"compile failed: {e}") from e
    x = torch.randn(5, 4)
    with torch.no_grad():
        expected = model(x)
    _assert_close(compiled({"x": x})["y"].cpu(), expected, "y")


# ---------------------------------------------------------------------------------------------
# 5. proxies


def test_output_proxy_feeds_another_compiled_function(ctx, tmp_path):
    fa = ctx.compile(lambda i: {"h": torch.relu(i["x"] @ i["w"])},
                     {"x": torch.zeros(3, 4), "w": torch.zeros(4, 5)}, tmp_path / "a")
    fb = ctx.compile(lambda i: {"z": i["h"].sum(dim=1) * 2}, {"h": torch.zeros(3, 5)}, tmp_path / "b")
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    a = fa({"x": x, "w": w})
    assert isinstance(a["h"], TensorProxy)
    assert a["h"].shape == torch.Size([3, 5]) and a["h"].dtype == torch.float32 and a["h"].dim() == 2
    b = fb({"h": a["h"]})
    _assert_close(b["z"].cpu(), torch.relu(x @ w).sum(dim=1) * 2, "B(A(x))")
    # a chain of three, all asynchronous until the final .cpu()
    c = fb({"h": fa({"x": x * 3, "w": w})["h"]})
    _assert_close(c["z"].cpu(), torch.relu((x * 3) @ w).sum(dim=1) * 2, "B(A(3x))")
    # a proxy with the wrong shape is refused like a tensor
    with pytest.raises(ValueError, match=r"input 'h': expected shape \[3, 5\]"):
        fb({"h": b["z"]})


def test_allocate_input_proxy_and_load_from(ctx, tmp_path):
    compiled = ctx.compile(_add, _add_sample(), tmp_path / "add")
    proxies = compiled.allocate_input_proxy()
    assert set(proxies) == {"x", "y"}
    assert all(p.shape == torch.Size([3, 4]) and p.dtype == torch.float32 for p in proxies.values())
    _assert_close(compiled(proxies)["out"].cpu(), torch.zeros(3, 4), "zero-filled slots")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    assert proxies["x"].load_from(x, clone=True) is proxies["x"]
    proxies["y"].load_from(y)
    expected, x0 = x + y, x.clone()
    x.add_(100.0)  # host edits after load_from never leak into the device value
    _assert_close(compiled(proxies)["out"].cpu(), expected, "proxies")
    _assert_close(proxies["x"].cpu(), x0, "proxy value")
    # proxies and host tensors mix
    _assert_close(compiled({"x": proxies["x"], "y": torch.ones(3, 4)})["out"].cpu(), x0 + 1, "mixed")
    with pytest.raises(ValueError, match=r"expected shape \[3, 4\] torch.float32, got \[4, 3\] torch.float32"):
        proxies["x"].load_from(torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"expected shape \[3, 4\] torch.float32, got \[3, 4\] torch.float64"):
        proxies["x"].load_from(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="load_from expects a torch.Tensor"):
        proxies["x"].load_from([[0.0] * 4] * 3)
    _assert_close(compiled(proxies)["out"].cpu(), expected, "unchanged after the failed loads")


def test_registered_value_proxy_load_from_changes_next_call(ctx, tmp_path):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 2))
    set_tensor_name(w, "lin.w")
    ctx.register_param(w)
    compiled = ctx.compile(lambda i: {"out": i["x"] @ w}, {"x": torch.zeros(3, 4)}, tmp_path / "mm")
    x = torch.randn(3, 4)
    w0 = w.detach().clone()
    first = compiled({"x": x})["out"]
    proxy = ctx.get_registered_value_proxy(w)
    assert proxy.shape == torch.Size([4, 2]) and proxy.dtype == torch.float32
    _assert_close(proxy.cpu(), w0, "registered value")
    new = torch.randn(4, 2)
    proxy.load_from(new)
    _assert_close(compiled({"x": x})["out"].cpu(), x @ new, "call after load_from")
    _assert_close(first.cpu(), x @ w0, "an earlier output keeps its value")
    _assert_close(ctx.get_registered_value_proxy(w).cpu(), new, "a new proxy sees the loaded value")
    with pytest.raises(ValueError, match=r"lin\.w: expected shape \[4, 2\] torch.float32, got \[2, 4\]"):
        proxy.load_from(torch.randn(2, 4))
    _assert_close(compiled({"x": x})["out"].cpu(), x @ new, "after the failed load")


def test_item_on_scalar_output(ctx, tmp_path):
    compiled = ctx.compile(lambda i: {"s": (i["x"] * i["y"]).sum(), "m": i["x"].mean(dim=0)},
                           _add_sample(), tmp_path / "dot")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    out = compiled({"x": x, "y": y})
    assert out["s"].shape == torch.Size([]) and out["s"].dim() == 0
    s = out["s"].item()
    assert isinstance(s, float)
    assert s == pytest.approx((x * y).sum().item(), rel=RTOL, abs=ATOL)
    assert out["m"].size() == torch.Size([4]) and out["m"].size(0) == 4
    _assert_close(torch.from_numpy(out["m"].numpy()), x.mean(dim=0), "numpy()")
    with pytest.raises(RuntimeError):  # torch's own message: only one-element tensors
        out["m"].item()


def test_passthrough_and_view_outputs(ctx, tmp_path):
    """Outputs that are an input itself or a view of one, and non-contiguous inputs."""
    compiled = ctx.compile(lambda i: {"same": i["x"], "row": i["x"][1], "t": i["x"].t()},
                           {"x": torch.zeros(3, 4)}, tmp_path / "views")
    base = torch.arange(12.0).reshape(4, 3)
    x = base.t()  # (3, 4), not contiguous
    out = compiled({"x": x})
    _assert_close(out["same"].cpu(), x, "same")
    _assert_close(out["row"].cpu(), x[1], "row")
    _assert_close(out["t"].cpu(), base, "t")
    assert out["t"].shape == torch.Size([4, 3])


# ---------------------------------------------------------------------------------------------
# 7. two contexts sharing a model


def test_switching_train_and_eval_contexts(tmp_path):
    torch.manual_seed(0)
    base = _mlp()
    batches = _batches(4)
    x_eval = torch.randn(5, 16, generator=torch.Generator().manual_seed(9))

    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, dampening=0)
    expected = []
    for b in batches:
        ref_opt.zero_grad()
        _ce(ref, b["x"], b["y"]).backward()
        ref_opt.step()
        with torch.no_grad():
            expected.append(ref(x_eval))

    model = copy.deepcopy(base)
    opt = MNCoreSGD(model.parameters(), lr=0.1, momentum=0.9)
    set_tensor_name_in_module(model, "model")
    set_buffer_name_in_optimizer(opt, "opt")
    train_ctx, eval_ctx = Context(MNDevice("pfvm:cpu")), Context(MNDevice("pfvm:cpu"))
    try:
        for p in model.parameters():
            train_ctx.register_param(p)
            eval_ctx.register_param(p)
        train_ctx.register_optimizer_buffers(opt)

        train_step = dict_train_step(model, opt)

        def eval_step(batch: dict) -> dict:
            with torch.no_grad():
                return {"logits": model(batch["x"])}

        train = train_ctx.compile(train_step, batches[0], tmp_path / "train")
        evaluate = eval_ctx.compile(eval_step, {"x": x_eval}, tmp_path / "eval")
        got = []
        for b in batches:
            train(b)
            got.append(evaluate({"x": x_eval})["logits"])
        for k, (g, e) in enumerate(zip(got, expected), start=1):
            _assert_close(g.cpu(), e, f"eval logits after train step {k}")
        Context.switch_context(train_ctx)  # eval context's values go back to the host
        train_ctx.synchronize()
        for p, q in zip(model.parameters(), ref.parameters()):
            _assert_close(p.detach(), q.detach(), "host parameter")
    finally:
        Context.switch_context(Context(MNDevice("pfvm:cpu")))


def test_switching_contexts_moves_values_back_to_host(tmp_path):
    """Without training: a value loaded in context A is visible in context B after switching."""
    w = torch.nn.Parameter(torch.zeros(2, 2))
    set_tensor_name(w, "w")
    a, b = Context(MNDevice("pfvm:cpu")), Context(MNDevice("pfvm:cpu"))
    try:
        a.register_param(w)
        b.register_param(w)
        fa = a.compile(lambda i: {"y": i["x"] @ w}, {"x": torch.zeros(1, 2)}, tmp_path / "a")
        fb = b.compile(lambda i: {"y": i["x"] @ w + 1}, {"x": torch.zeros(1, 2)}, tmp_path / "b")
        x = torch.tensor([[1.0, 2.0]])
        new = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
        Context.switch_context(a)
        a.get_registered_value_proxy(w).load_from(new)
        _assert_close(fa({"x": x})["y"].cpu(), x @ new, "context A")
        _assert_close(fb({"x": x})["y"].cpu(), x @ new + 1, "context B sees A's value")  # switches to B
        assert torch.equal(w.detach(), new), "switching did not write A's value back to the host"
        b.get_registered_value_proxy(w).load_from(2 * new)
        _assert_close(fa({"x": x})["y"].cpu(), x @ (2 * new), "context A sees B's value")
    finally:
        Context.switch_context(Context(MNDevice("pfvm:cpu")))
    assert torch.equal(w.detach(), 2 * new)


# ---------------------------------------------------------------------------------------------
# 8. tensors neither inputs nor registered are frozen constants, with a warning


def test_unregistered_tensors_are_frozen_with_a_warning(ctx, tmp_path):
    scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
    offset = torch.full((4,), 0.5)
    set_tensor_name(offset, "extra.offset")

    def fn(i: dict) -> dict:
        return {"out": i["x"] * scale + offset}

    with pytest.warns(UserWarning, match=r"neither inputs nor registered.*frozen") as record:
        compiled = ctx.compile(fn, {"x": torch.zeros(2, 4)}, tmp_path / "frozen")
    msg = "\n".join(str(w.message) for w in record)
    assert "tensor(shape=[4], dtype=torch.float32, device=cpu)" in msg and "extra.offset" in msg, msg
    x = torch.randn(2, 4)
    expected = x * scale + offset
    _assert_close(compiled({"x": x})["out"].cpu(), expected, "out")
    scale.mul_(10.0)  # frozen: later host edits are not seen
    _assert_close(compiled({"x": x})["out"].cpu(), expected, "out after editing the host constant")
    manifest = json.loads((tmp_path / "frozen" / "manifest.json").read_text())
    assert manifest["frozen_constants"] == ["tensor(shape=[4], dtype=torch.float32, device=cpu)", "extra.offset"]


def test_unregistered_model_parameters_are_frozen(ctx, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    set_tensor_name_in_module(model, "model")  # named but never registered
    with pytest.warns(UserWarning, match=r"frozen into the compiled function: .*model\.bias"):
        compiled = ctx.compile(lambda i: {"y": model(i["x"])}, {"x": torch.zeros(2, 4)}, tmp_path / "frozen")
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
    _assert_close(compiled({"x": x})["y"].cpu(), expected, "y")


@pytest.mark.filterwarnings("ignore:Context.compile:UserWarning")
def test_frozen_warning_names_unregistered_linear_weight(ctx, tmp_path):
    model = torch.nn.Linear(4, 3)
    set_tensor_name_in_module(model, "model")
    with pytest.warns(UserWarning, match=r"frozen into the compiled function: .*model\.weight"):
        ctx.compile(lambda i: {"y": model(i["x"])}, {"x": torch.zeros(2, 4)}, tmp_path / "frozen")


def test_no_warning_when_everything_is_registered(ctx, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    set_tensor_name_in_module(model, "model")
    for p in model.parameters():
        ctx.register_param(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled = ctx.compile(lambda i: {"y": model(i["x"])}, {"x": torch.zeros(2, 4)}, tmp_path / "clean")
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
    _assert_close(compiled({"x": x})["y"].cpu(), expected, "y")


# ---------------------------------------------------------------------------------------------
# 9. random ops


def test_dropout_masks_differ_per_call_and_follow_manual_seed(ctx, tmp_path):
    compiled = ctx.compile(lambda i: {"out": F.dropout(i["x"], p=0.5, training=True)},
                           {"x": torch.zeros(256)}, tmp_path / "dropout")
    x = torch.rand(256) + 1.0  # nonzero everywhere: zeros in the output are exactly the dropped ones

    torch.manual_seed(123)
    first = [compiled({"x": x})["out"].cpu() for _ in range(3)]
    torch.manual_seed(123)
    again = [compiled({"x": x})["out"].cpu() for _ in range(3)]
    torch.manual_seed(124)
    other = compiled({"x": x})["out"].cpu()

    masks = [o != 0 for o in first]
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    assert not torch.equal(masks[0], other != 0)
    for k, (a, b) in enumerate(zip(first, again)):
        assert torch.equal(a, b), f"call {k} differs after the same torch.manual_seed"
    for o, m in zip(first, masks):
        _assert_close(o[m], x[m] * 2.0, "kept elements are scaled by 1/(1-p)")
        assert 0.3 < m.float().mean().item() < 0.7


# ---------------------------------------------------------------------------------------------
# 10. codegen_dir


def test_codegen_dir_manifest(ctx, tmp_path):
    def fn(i: dict) -> dict:
        return {"loss": F.cross_entropy(i["x"], i["y"]), "probs": i["x"].softmax(dim=1).to(torch.float64)}

    sample = {"x": torch.randn(3, 4), "y": torch.randint(0, 4, (3,))}
    codegen = storage.path(tmp_path) / "nested" / "codegen"
    compiled = ctx.compile(fn, sample, codegen, options={"float_dtype": "float"},
                           cache_options=CacheOptions(tmp_path / "cache"))
    assert compiled.codegen_dir == codegen
    manifest = json.loads((codegen / "manifest.json").read_text())
    assert manifest["input_specs"] == {"x": {"shape": [3, 4], "dtype": "float32"},
                                       "y": {"shape": [3], "dtype": "int64"}}
    assert manifest["output_specs"] == {"loss": {"shape": [], "dtype": "float32"},
                                        "probs": {"shape": [3, 4], "dtype": "float64"}}
    assert {(i["name"], tuple(i["shape"]), i["dtype"]) for i in manifest["inputs"]} == {
        ("x", (3, 4), "float32"), ("y", (3,), "int64")}
    assert {(o["name"], tuple(o["shape"]), o["dtype"]) for o in manifest["outputs"]} == {
        ("loss", (), "float32"), ("probs", (3, 4), "float64")}
    assert all(io["dram"].startswith("DRAM@") for io in manifest["inputs"] + manifest["outputs"])
    assert manifest["options"] == {"float_dtype": "float"}
    assert manifest["device"] == "pfvm:cpu"
    assert manifest["frozen_constants"] == [] and manifest["state_updates"] == []
    assert "def forward" in (codegen / "graph.py").read_text()
    assert {k: (list(m[0]), m[2]) for k, m in compiled.output_specs.items()} == {
        "loss": ([], torch.float32), "probs": ([3, 4], torch.float64)}
    # the compiled function agrees with eager
    x, y = torch.randn(3, 4), torch.randint(0, 4, (3,))
    out = compiled({"x": x, "y": y})
    _assert_close(out["loss"].cpu(), F.cross_entropy(x, y), "loss")
    _assert_close(out["probs"].cpu(), x.softmax(dim=1).to(torch.float64), "probs")


def test_codegen_manifest_lists_state_updates(ctx, tmp_path):
    """With registered parameters and an optimizer the manifest names the updated state."""
    torch.manual_seed(0)
    model = _mlp()
    opt = MNCoreSGD(model.parameters(), lr=0.1, momentum=0.9)
    _context_train(ctx, model, opt, _batches(1), tmp_path / "train")
    manifest = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert manifest["input_specs"] == {"x": {"shape": [8, 16], "dtype": "float32"},
                                       "y": {"shape": [8], "dtype": "int64"}}
    assert manifest["output_specs"] == {"loss": {"shape": [], "dtype": "float32"}}
    assert manifest["frozen_constants"] == []
    names = [f"model.{n}" for n, _ in model.named_parameters()] + [f"opt.{k}.momentum_buffer" for k in range(4)]
    assert manifest["state_updates"] == sorted(names)
    assert {o["name"] for o in manifest["outputs"]} == {"loss"} | {f"{n} (updated)" for n in names}
