"""Re-inplacing (``mncore/compile/reinplace.py``): the code pfvm runs writes fresh intermediates in place.
The other rewrites of that code are checked here too: double transposes dropped, ops called through
bound entries (``Executable.python_code``).

Two references: the functional graph the compiler keeps (run as an FX module on the same inputs, it must
give bit-identical outputs: the same ATen kernels, in-place or not, on the same inputs in the same order
compute the same values, so equality is the property under test, not a tolerance left out) and eager
PyTorch on the CPU (within the usual tolerances). Hand-made graphs check each rule (no program input, output, view, repeated argument,
other dtype or shape is ever written); training steps check it on real graphs, AdamW's foreach ops included.
"""
from __future__ import annotations

import copy
import operator
import re

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_leaves, tree_map

import mncore
import model_zoo
from harness.runner import disable_dropout
from mncore.cache import memory as compile_cache
from mncore.compile.executable import bind_ops
from mncore.compile.passes import drop_double_transposes
from mncore.compile.reinplace import reinplace
from mncore.devices.pfvm import PfvmDevice
from mncore.ir.meta import meta_of

pytestmark = pytest.mark.unit
aten = torch.ops.aten


def _graph(fn, *inputs) -> fx.Graph:
    """``fn`` as an ATen-level FX graph whose nodes carry ``meta["mn"]`` as mncore's graph builder sets it."""
    gm = make_fx(fn)(*inputs)
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (list, tuple)) else [val]
        node.meta["mn"] = [meta_of(v) if isinstance(v, torch.Tensor) else None for v in vals]
    return gm.graph


def _inplace_ops(graph: fx.Graph) -> list[str]:
    """The in-place ops of a graph that had none (traced graphs are functional)."""
    return [n.target._schema.name.split("::")[1] for n in graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.name.endswith("_")]


def _clone(tree):
    return tree_map(lambda x: x.clone(), tree)


def _check(fn, *inputs) -> list[str]:
    """Re-inplace ``fn``'s graph; its outputs must equal the functional graph's bit for bit and eager's, and
    no input may change. Returns the ops that now write in place."""
    graph = _graph(fn, *inputs)
    functional = fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph))
    count = reinplace(graph)
    graph.lint()
    rewritten = fx.GraphModule(torch.nn.Module(), graph)
    kept = _clone(inputs)
    want = functional(*_clone(inputs))
    got = rewritten(*inputs)
    for x, k in zip(tree_leaves(inputs), tree_leaves(kept)):
        assert torch.equal(x, k), "a program input was written"
    flat_want, flat_got = tree_leaves(want), tree_leaves(got)
    assert len(flat_want) == len(flat_got)
    for w, g in zip(flat_want, flat_got):
        assert torch.equal(w, g)
    torch.testing.assert_close(flat_got, tree_leaves(fn(*kept)))  # eager: the independent reference
    ops = _inplace_ops(graph)
    assert len(ops) == count
    return ops


def test_a_chain_of_pointwise_ops_writes_into_its_first_intermediate():
    x = torch.randn(4, 5)
    assert _check(lambda x: ((x * 2) + 1).relu().tanh(), x) == ["add_", "relu_", "tanh_"]


def test_program_inputs_and_outputs_are_never_written():
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    assert _check(lambda x, y: x + y, x, y) == []  # both arguments are the caller's
    assert _check(lambda x: (lambda a: (a, a + 1))(x * 2), x) == []  # a is returned as well as read


def test_a_value_a_view_shares_is_not_written():
    x = torch.randn(3, 3)

    def fn(x):
        a = x * 2
        t = a.t()
        b = a + 1  # writing into a would change t, read below
        return t @ b

    assert _check(fn, x) == []


def test_a_value_read_after_the_op_is_not_written():
    x = torch.randn(6)

    def fn(x):
        a = x * 2
        b = a + 1
        return b * a  # a is read again after b: b may not take a's memory

    assert "add_" not in _check(fn, x)


def test_a_value_passed_twice_is_not_written():
    x = torch.randn(6)
    assert _check(lambda x: (lambda a: a * a)(x + 1), x) == []


def test_other_dtype_or_a_broadcast_result_is_not_written():
    i = torch.arange(6)
    assert _check(lambda i: (i * 2) + 0.5, i) == []  # int intermediate, float result
    x, y = torch.randn(3), torch.randn(4, 3)
    assert _check(lambda x, y: (x * 2) + y, x, y) == []  # the result is larger than the intermediate


def test_an_undeclared_view_is_not_taken_as_fresh():
    x = torch.randn(2, 3)

    def fn(x):
        a = x * 2
        v = aten._unsafe_view.default(a, [6])
        return a, v + 1  # writing v would change a, which is returned

    assert _check(fn, x) == []


def test_foreach_ops_write_their_fresh_lists_and_their_readers_read_those():
    xs = [torch.rand(3), torch.rand(2, 2)]  # non-negative: sqrt below
    gs = [torch.randn(3), torch.randn(2, 2)]

    def fn(xs, gs):
        a = torch._foreach_mul(xs, 0.9)
        b = torch._foreach_addcmul(a, gs, gs, value=0.1)
        return torch._foreach_sqrt(b)

    assert _check(fn, xs, gs) == ["_foreach_addcmul_", "_foreach_sqrt_"]


def test_a_foreach_list_with_an_element_read_later_is_not_written():
    xs = [torch.randn(3), torch.randn(3)]

    def fn(xs):
        a = torch._foreach_mul(xs, 2.0)
        b = torch._foreach_add(a, 1.0)
        return b, a[1]

    assert _check(fn, xs) == []


# -- training steps: the code pfvm runs against the functional graph, on the inputs it really got ---------
def _adamw_mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    return model, lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True), batch, \
        lambda m, x, y: F.cross_entropy(m(x), y)


def _sgd_transformer():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return model, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), (torch.randn(2, 5, 16),), \
        lambda m, x: m(x).pow(2).mean()


def _gpt2_tiny():
    spec = model_zoo.get("gpt2_small")
    model = disable_dropout(spec.build("tiny", seed=0))  # eager CPU and the device draw other random streams
    batch = spec.make_batch("tiny", seed=0)
    names = list(batch)
    return model, spec.optimizer, tuple(batch.values()), \
        lambda m, *xs: spec.loss(m, dict(zip(names, xs)))


@pytest.mark.parametrize("build", [_adamw_mlp, _sgd_transformer, _gpt2_tiny], ids=lambda b: b.__name__[1:])
def test_training_steps_run_in_place_and_match_the_functional_graph_and_eager(monkeypatch, build):
    runs: list = []
    run = PfvmDevice.run

    def recording(self, exe, leaves, args, submitted):
        runs.append((exe, [a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        return run(self, exe, leaves, args, submitted)

    monkeypatch.setattr(PfvmDevice, "run", recording)
    model, opt_fn, batch, loss_fn = build()
    eager_model = copy.deepcopy(model)
    compile_cache.clear()
    lazy_model = copy.deepcopy(model).mncore()
    opt, eager_opt = opt_fn(lazy_model.parameters()), opt_fn(eager_model.parameters())
    for _ in range(2):  # the second step reads optimizer state made by the first
        for m, o, xs in ((lazy_model, opt, [b.mncore() for b in batch]), (eager_model, eager_opt, batch)):
            o.zero_grad()
            loss_fn(m, *xs).backward()
            o.step()
        mncore.sync()
    mncore.wait_device_ops()
    for p, q in zip(lazy_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
    step = [(exe, args) for exe, args in runs if exe.stats["reinplaced"]]
    assert step, "no graph of the step was re-inplaced"
    for exe, args in step:
        kept = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        want = exe.gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        got = exe.python_code()(*args)
        assert all(torch.equal(a, k) for a, k in zip(args, kept) if isinstance(a, torch.Tensor)), \
            "the generated code wrote a program input"
        assert len(want) == len(got) and all(torch.equal(w, g) for w, g in zip(want, got))
        ptrs = [g.untyped_storage().data_ptr() for g in got if g.numel()]
        assert len(set(ptrs)) == len(ptrs), "two outputs share memory"


def test_the_disk_cache_keeps_the_in_place_code(sim_env, tmp_path):
    """An executable loaded from the disk cache runs the same in-place code it was compiled with."""
    sim_env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    mncore.init("pfvm:cpu")
    xs = torch.randn(4, 8)

    def step():
        w = xs.mncore()
        out = (((w * 2) + 1).relu() * 3).sum(0)
        mncore.sync()
        return out.cpu()

    compile_cache.clear()
    first = step()
    exe = next(e for e in compile_cache.values() if e.stats["reinplaced"])
    compile_cache.clear()
    again = step()
    [loaded] = [e for e in compile_cache.values() if e.name == exe.name]
    assert loaded is not exe and loaded.code == exe.code and exe.stats["reinplaced"] >= 2
    assert ".add_." in loaded.code and torch.equal(first, again)
    torch.testing.assert_close(again, (((xs * 2) + 1).relu() * 3).sum(0))


def test_operator_getitem_of_a_view_list_is_not_fresh():
    x = torch.randn(4, 2)

    def fn(x):
        a = x * 2
        parts = torch.split(a, 2)
        return a.sum(), parts[0] + 1  # writing parts[0] would change a's memory

    graph = _graph(fn, x)
    assert any(n.target is operator.getitem for n in graph.nodes)
    assert _check(fn, x) == []


def test_reinplace_off_runs_the_functional_graph(monkeypatch):
    """``MNCORE_REINPLACE=0`` (here ``config.override``): pfvm runs ``exe.gm``, not the rewritten code."""
    from mncore.compile.executable import Executable

    def refuse(self):
        raise AssertionError("the rewritten code ran")

    monkeypatch.setattr(Executable, "python_code", refuse)
    x = torch.randn(5, 3)
    with mncore.config.override(reinplace=False):
        y = ((x.mncore() * 2) + 1).relu()
        mncore.sync()
        mncore.wait_device_ops()
    torch.testing.assert_close(y.cpu(), ((x * 2) + 1).relu())
    with mncore.config.override(reinplace=True):
        z = ((x.mncore() * 3) + 1).relu()
        mncore.sync()
        with pytest.raises(mncore.errors.DeviceExecutionError, match="the rewritten code ran"):
            mncore.wait_device_ops()
    del z


def test_double_transposes_are_dropped_and_the_values_kept():
    def fn(w, x):
        b = w.t()
        return w.t().t() * 2, b + 1, b.t() - 1, x.t().t() * 3  # the last: t of a 1-d tensor is itself

    w, x = torch.randn(3, 4), torch.randn(5)
    graph = _graph(fn, w, x)
    functional = fx.GraphModule(torch.nn.Module(), copy.deepcopy(graph))
    assert drop_double_transposes(graph) == 3
    graph.lint()
    # the one t left is b, which an output reads; the inner t of each dropped pair went with it
    assert [n.target for n in graph.nodes].count(aten.t.default) == 1
    got = fx.GraphModule(torch.nn.Module(), graph)(w, x)
    want = functional(w, x)
    assert all(torch.equal(g, v) for g, v in zip(got, want))
    for g, e in zip(got, fn(w, x)):
        torch.testing.assert_close(g, e)


def test_a_training_step_runs_without_double_transposes(monkeypatch):
    """Lazy mode's MLP step held ``t(t(.))`` for each weight read in backward and each weight gradient."""
    runs: list = []
    run = PfvmDevice.run
    monkeypatch.setattr(PfvmDevice, "run", lambda self, exe, *a: runs.append(exe) or run(self, exe, *a))
    compile_cache.clear()
    model, opt_fn, batch, loss_fn = _adamw_mlp()
    model = model.mncore()
    opt = opt_fn(model.parameters())
    loss_fn(model, *[b.mncore() for b in batch]).backward()
    opt.step()
    mncore.sync()
    mncore.wait_device_ops()
    [exe] = [e for e in runs if e.stats.get("transposes_dropped")]
    assert exe.stats["transposes_dropped"] == 3  # W2 in backward, and both weight gradients
    transposed = dict(re.findall(r"(\w+) = torch\.ops\.aten\.t\.default\((\w+)\)", exe.code))
    assert transposed and not [v for v in transposed.values() if v in transposed]


def test_bind_ops_binds_overloads_and_leaves_the_rest():
    x = torch.randn(6)
    code = ("\n\ndef forward(self, x):\n"
            "    a = torch.ops.aten.relu.default(x)\n"
            "    b = torch.ops.aten.mul.Tensor(a, a)\n"
            "    c = torch.ops.aten.neg(b)\n"  # an overload packet, not an overload: left as written
            "    return (a, b, c)\n")
    forward = bind_ops(code, {"torch": torch}, "test")
    names = set(forward.__code__.co_names)
    assert {"__mn_aten_relu_default", "__mn_aten_mul_Tensor", "neg"} <= names and not {"relu", "mul"} & names
    a, b, c = forward(None, x)
    assert torch.equal(a, x.relu()) and torch.equal(b, x.relu() * x.relu()) and torch.equal(c, -(x.relu() * x.relu()))
    # a name the code already uses is never shadowed: that op keeps FX's call
    clash = code.replace("    c = ", "    __mn_aten_relu_default = 1\n    c = ")
    names = set(bind_ops(clash, {"torch": torch}, "test").__code__.co_names)
    assert "relu" in names and "__mn_aten_mul_Tensor" in names
