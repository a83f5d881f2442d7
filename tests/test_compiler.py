"""The compiler (passes, fusion, memory plan, cost, codegen) on real training graphs.

The graphs are a 3-layer MLP training step (SGD) and a small transformer encoder block training step,
traced in lazy mode and compiled for ``emu2``, whose emulator runs the kernel program kernel by kernel
(so a kernel order that is not topological would fail there); each result is checked against eager
PyTorch on CPU. Invariants are checked on the compiled executables (``mncore.cache.memory``);
FLOPs and modelled times are recomputed from the shapes and from ``hardware.json`` / ``costs.json``.
"""
from __future__ import annotations

import copy
import json
import math
import operator
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SIM_ENV_VARS, back_to_cpu
import torch
import torch.nn.functional as F
import zstandard

import mncore
from mncore.compile import codegen, dump
from mncore.compile.fusion import base_op
from mncore.cache import memory as compile_cache
from mncore.sim.cost import cost_model

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-6  # float32 vs float32: only summation order may differ
ANCHORS = ("complex", "reduction", "opaque")


@pytest.fixture
def env(sim_env):
    return sim_env


def _step_graphs(build, device: str = "emu2", policy: str = "float") -> tuple[list, tuple, tuple]:
    """Run ``build()``'s training step lazily on ``device`` and eagerly; returns (executables, lazy, eager)."""
    model, opt_fn, batch, loss_fn = build()
    eager_model = copy.deepcopy(model)
    eager_opt = opt_fn(eager_model.parameters())
    eager_opt.zero_grad()
    eager_loss = loss_fn(eager_model, *batch)
    eager_loss.backward()
    eager_opt.step()
    with pytest.MonkeyPatch.context() as mp:
        for var in SIM_ENV_VARS:
            mp.delenv(var, raising=False)
        mncore.init(device, float_dtype=policy)
        try:
            compile_cache.clear()
            lazy_model = copy.deepcopy(model).mncore()
            opt = opt_fn(lazy_model.parameters())
            opt.zero_grad()
            loss = loss_fn(lazy_model, *[b.mncore() for b in batch])
            loss.backward()
            opt.step()
            mncore.sync()
            mncore.wait_device_ops()
            exes = list(compile_cache.values())
            lazy = (loss.cpu(), [p.detach().cpu() for p in lazy_model.parameters()])
        finally:
            back_to_cpu()
    return exes, lazy, (eager_loss.detach(), [p.detach() for p in eager_model.parameters()])


def _mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4))
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    return model, lambda ps: torch.optim.SGD(ps, lr=0.1), batch, lambda m, x, y: F.cross_entropy(m(x), y)


def _transformer():
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    batch = (torch.randn(2, 5, 16),)
    return model, lambda ps: torch.optim.SGD(ps, lr=0.1), batch, lambda m, x: m(x).pow(2).mean()


BUILDS = {"mlp": _mlp, "transformer": _transformer}


@pytest.fixture(scope="module")
def compiled() -> dict:
    out = {}
    for name, build in BUILDS.items():
        exes, lazy, eager = _step_graphs(build)
        assert len(exes) == 1, [e.name for e in exes]  # one graph per training step
        out[name] = {"exe": exes[0], "lazy": lazy, "eager": eager}
    return out


@pytest.fixture(params=sorted(BUILDS))
def exe(request, compiled):
    return compiled[request.param]["exe"]


def _calls(exe) -> list:
    return [n for n in exe.gm.graph.nodes if n.op == "call_function"]


def _home(exe) -> dict:
    return {n: k for k in exe.kernels for n in k.nodes}


# ---------------------------------------------------------------------------------------------
# fusion


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_emulated_kernel_program_matches_eager(compiled, name):
    (loss, params), (e_loss, e_params) = compiled[name]["lazy"], compiled[name]["eager"]
    torch.testing.assert_close(loss, e_loss, rtol=RTOL, atol=ATOL)
    for p, e in zip(params, e_params):
        torch.testing.assert_close(p, e, rtol=RTOL, atol=ATOL)


def test_every_call_node_is_in_exactly_one_kernel(exe):
    members = [n for k in exe.kernels for n in k.nodes]
    assert len(members) == len(set(members)), "a node sits in two kernels"
    assert set(members) == set(_calls(exe))
    assert exe.stats["nodes"] == exe.n_nodes == len(_calls(exe))
    assert exe.stats["kernels"] == len(exe.kernels) < len(_calls(exe))  # fusion did merge something


def test_kernels_are_in_topological_order(exe):
    order = {n: i for i, n in enumerate(exe.gm.graph.nodes)}
    home = _home(exe)
    assert [k.index for k in exe.kernels] == list(range(len(exe.kernels)))
    for k in exe.kernels:
        assert [order[n] for n in k.nodes] == sorted(order[n] for n in k.nodes), f"kernel {k.index}: node order"
        for n in k.nodes:
            for a in n.all_input_nodes:
                if a in home:
                    assert home[a].index <= k.index, f"kernel {k.index} reads {a.name} of later kernel {home[a].index}"
        for a in k.inputs:
            assert a not in k.nodes and (a.op == "placeholder" or home[a].index < k.index)


def test_kernel_inputs_and_outputs_are_complete(exe):
    home = _home(exe)
    for k in exe.kernels:
        members = set(k.nodes)
        external = {a for n in k.nodes for a in n.all_input_nodes if a not in members}
        assert set(k.inputs) == external, f"kernel {k.index}"
        for n in k.nodes:
            escapes = any(u not in members for u in n.users)
            if escapes and not n.meta.get("mn_tuple"):
                assert n in k.outputs, f"kernel {k.index}: {n.name} is read outside but is not an output"
        for o in k.outputs:
            assert home[o] is k and any(u not in members for u in o.users)


def test_each_kernel_has_at_most_one_anchor(exe):
    for k in exe.kernels:
        classes = [n.meta["mn_class"] for n in k.nodes if n.target is not operator.getitem]
        anchors = [c for c in classes if c in ANCHORS]
        assert len(anchors) <= 1, f"kernel {k.index} has anchors {anchors}"
        if anchors:
            assert k.kind == anchors[0] == k.anchor
            if anchors[0] == "opaque":
                assert len(classes) == 1, f"opaque op fused: {classes}"
        else:
            assert k.kind in ("elementwise", "injective", "view")
            assert set(classes) <= {"elementwise", "injective"}


def test_elementwise_epilogues_are_fused_into_matmul_kernels(compiled):
    for name in BUILDS:
        exe = compiled[name]["exe"]
        home = _home(exe)
        relus = [n for n in _calls(exe) if "relu" in str(base_op(n.target))]
        assert relus, name
        for r in relus:
            # the producer chain up to the matmul (through reshapes of its output)
            p = r.all_input_nodes[0]
            while "mm" not in str(base_op(p.target)):
                p = p.all_input_nodes[0]
            assert home[p] is home[r], f"{name}: {r.name} is not fused into the kernel of {p.name}"
            assert home[r].kind == "complex"
    mlp = compiled["mlp"]["exe"]
    n_mm = sum(1 for n in _calls(mlp) if n.meta["mn_class"] == "complex")
    assert mlp.stats["kernels_by_kind"]["complex"] == n_mm  # every matmul starts its own kernel


def test_silu_and_mish_gradients_are_one_fused_elementwise_op():
    """They reach the tracer whole (not as PyTorch's composite steps) and join their neighbours' kernel;
    ``mish_backward`` carries no pointwise tag, so the compiler names it elementwise itself."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 16), torch.nn.Mish(),
                                    torch.nn.Linear(16, 2))
        return model, lambda ps: torch.optim.SGD(ps, lr=0.1), (torch.randn(4, 8),), lambda m, x: m(x).pow(2).mean()

    exes, lazy, eager = _step_graphs(build)
    torch.testing.assert_close(lazy, eager)
    home = _home(exes[0])
    for name in ("silu_backward", "mish_backward"):
        (node,) = [n for n in _calls(exes[0]) if name in str(base_op(n.target))]
        assert node.meta["mn_class"] == "elementwise", (name, node.meta["mn_class"])
        assert len(home[node].nodes) > 1, f"{name} sits alone in its kernel"


def test_kernels_by_kind_counts_every_kernel(exe):
    by_kind = exe.stats["kernels_by_kind"]
    for kind in {k.kind for k in exe.kernels}:
        assert by_kind.get(kind) == sum(1 for k in exe.kernels if k.kind == kind), (kind, by_kind)
    assert sum(by_kind.values()) == len(exe.kernels), by_kind


def test_no_dead_nodes_after_dce(exe):
    for n in _calls(exe):
        assert n.users, f"{n.name} has no users"


# ---------------------------------------------------------------------------------------------
# CSE and constant deduplication


def _twice(x, dev: str = "mncore"):
    a = (x * 2 + 1).sin()
    b = (x * 2 + 1).sin()  # the same expression again: mul, add, sin
    c = torch.ones(4, 4, device=dev) * 3
    d = torch.ones(4, 4, device=dev) * 3  # the same constant again (and the same mul of it)
    return a + b + c + d


def _once(x, dev: str = "mncore"):
    a = (x * 2 + 1).sin()
    c = torch.ones(4, 4, device=dev) * 3
    return a + a + c + c


def _compile_fn(fn, x) -> tuple:
    compile_cache.clear()
    mncore.metrics.reset()
    out = fn(x.mncore())
    mncore.sync()
    out = out.cpu()
    (exe,) = compile_cache.values()
    return exe, out, mncore.metrics.counters()["traced_ops"]


def test_cse_and_constant_dedup_shrink_the_graph_and_keep_results(env):
    mncore.init("emu2")
    x = torch.randn(4, 4)
    exe_twice, out_twice, traced_twice = _compile_fn(_twice, x)
    exe_once, out_once, traced_once = _compile_fn(_once, x)
    torch.testing.assert_close(out_twice, _twice(x, "cpu"), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(out_once, _once(x, "cpu"), rtol=RTOL, atol=ATOL)
    assert traced_twice - traced_once == 5  # the tracer saw mul, add, sin, ones, mul once more
    assert exe_twice.n_nodes == exe_once.n_nodes  # ... and the compiler removed all five
    removed = exe_twice.stats["cse_eliminated"] + exe_twice.stats["constants_deduplicated"]
    assert removed == 5 and exe_twice.stats["dce_eliminated"] == 0
    assert exe_once.stats["cse_eliminated"] + exe_once.stats["constants_deduplicated"] == 0


def test_cse_statistics_tell_expressions_from_constants(env):
    mncore.init("emu2")
    exe, _, _ = _compile_fn(_twice, torch.randn(4, 4))
    assert exe.stats["constants_deduplicated"] == 1  # torch.ones
    assert exe.stats["cse_eliminated"] == 4  # mul, add, sin and the mul of the merged constant


def test_cse_never_merges_random_ops(env):
    mncore.init("emu2")
    compile_cache.clear()
    a = torch.rand(1000, device="mncore")
    b = torch.rand(1000, device="mncore")
    c = a - b
    mncore.sync()
    (exe,) = compile_cache.values()
    assert not torch.equal(a.cpu(), b.cpu())
    torch.testing.assert_close(c.cpu(), a.cpu() - b.cpu())
    random_nodes = [n for n in _calls(exe) if "uniform" in getattr(n.target, "__name__", str(n.target))]
    assert len(random_nodes) == 2, exe.gm.graph  # (their uninitialised `empty` shape templates may merge)


# ---------------------------------------------------------------------------------------------
# memory plan


def _storage_bytes(meta, policy: str) -> int:
    shape, _, dtype = meta
    n = math.prod(shape)
    if dtype.is_floating_point:
        return n * {"double": 8, "half": 2}.get(policy, dtype.itemsize if dtype.itemsize < 4 else 4)
    return n * dtype.itemsize


def _placed(exe) -> dict:
    placed = {p.name: p for p in exe.plan.placements}
    assert len(placed) == len(exe.plan.placements), "two placements for one value"
    return placed


def _viewed(node, members) -> object:
    """The value of the same kernel that ``node`` (an aten view op) reinterprets, else None."""
    op = node.target
    base = node.args[0] if node.args else None
    if op is not operator.getitem and getattr(op, "is_view", False) and base in members:
        return base
    return None


def _root(exe, node, placed, home):
    """The placement holding ``node``: its own, or (a view kernel's output, or a view of another value of its
    kernel) the one of the value it views."""
    while node.name not in placed:
        k = home.get(node)
        assert k is not None, f"{node.name} has no DRAM placement"
        if k.kind == "view" and len(k.inputs) == 1:
            node = k.inputs[0]
        else:
            base = _viewed(node, set(k.nodes))
            assert base is not None, f"{node.name} has no DRAM placement"
            node = base
    return placed[node.name]


def _written(k, policy: str) -> int:
    """Bytes of kernel ``k``'s outputs, each buffer once: an output viewing another output shares its buffer."""
    members, outs = set(k.nodes), set(k.outputs)

    def base(n):
        while (b := _viewed(n, members)) is not None:
            n = b
        return n

    return sum(_storage_bytes(o.meta["mn"][0], policy) for o in k.outputs
               if o.meta["mn"][0] is not None and (o is base(o) or base(o) not in outs))


def test_memory_plan_invariants(exe):
    plan, n_k = exe.plan, len(exe.kernels)
    placed, home = _placed(exe), _home(exe)
    for p in plan.placements:
        assert p.start % 64 == 0 and p.size % 64 == 0 and p.size > 0, p
    # no two values alive at the same time share an address
    ps = plan.placements
    for i, p in enumerate(ps):
        for q in ps[i + 1:]:
            if p.first <= q.last and q.first <= p.last:
                assert p.end <= q.start or q.end <= p.start, f"{p} overlaps {q} while both are alive"
    assert plan.peak_bytes == max(p.end for p in ps) == exe.stats["peak_bytes"]
    assert plan.live_peak_bytes <= plan.peak_bytes
    nodes = {n.name: n for n in exe.gm.graph.nodes}
    for p in ps:
        assert p.size >= _storage_bytes(nodes[p.name].meta["mn"][0], exe.policy)
    # inputs: resident for the whole job
    inputs = [n for n in exe.gm.graph.nodes if n.op == "placeholder" and n.meta["mn"][0] is not None]
    for n in inputs:
        p = placed[n.name]
        assert (p.first, p.last) == (-1, n_k)
    assert plan.peak_bytes >= sum(placed[n.name].size for n in inputs)
    # every value a kernel reads is alive while it runs; every kernel output is placed when written
    for k in exe.kernels:
        for a in k.inputs:
            if a.meta["mn"][0] is None:  # a lifted Python scalar: a job argument, not a DRAM value
                continue
            p = _root(exe, a, placed, home)
            assert p.first < k.index <= p.last, f"kernel {k.index} reads {a.name} outside its lifetime {p}"
        for o in k.outputs:
            p = _root(exe, o, placed, home)
            assert p.first <= k.index
            if o.name in placed:
                assert p.first == k.index
    # graph outputs: alive at the end
    out_node = next(n for n in exe.gm.graph.nodes if n.op == "output")
    for o in out_node.args[0]:
        assert _root(exe, o, placed, home).last == n_k


def test_memory_plan_reuses_dead_values(compiled):
    exe = compiled["transformer"]["exe"]
    total = sum(p.size for p in exe.plan.placements)
    assert exe.plan.peak_bytes < total, "liveness never let a value reuse the range of a dead one"


# ---------------------------------------------------------------------------------------------
# FLOPs and the cost model


def test_matmul_flops_are_2mnk(exe):
    seen = 0
    for n in _calls(exe):
        op = str(base_op(n.target))
        if op in ("aten.mm.default", "aten.addmm.default"):
            a, b = (n.args[0], n.args[1]) if op == "aten.mm.default" else (n.args[1], n.args[2])
            (m, k), (k2, nn) = a.meta["mn"][0][0], b.meta["mn"][0][0]
            assert k == k2
            assert n.meta["mn_flops"] == 2 * m * nn * k, n.format_node()
            seen += 1
    assert seen >= 3
    for k in exe.kernels:
        assert k.flops == sum(n.meta["mn_flops"] for n in k.nodes)
    assert exe.stats["flops"] == sum(k.flops for k in exe.kernels)


def _json_values(name: str) -> dict:
    raw = json.loads((ROOT / "mncore/sim" / name).read_text())
    return {k: v["value"] for k, v in raw.items() if isinstance(v, dict) and "value" in v}


FORMATS = {"float": {"complex": "float", "other": "float"}, "double": {"complex": "double", "other": "double"},
           "mixed": {"complex": "half", "other": "float"}, "half": {"complex": "half", "other": "half"}}


@pytest.mark.parametrize("policy", ["float", "double", "mixed", "half"])
def test_modelled_kernel_time_follows_the_cost_model(env, policy):
    """time = max(flops / (peak x efficiency), bytes / (DRAM bw x efficiency)) + overhead, from the JSON files.

    Compiled for pfvm:cpu (the policy shapes formats, byte widths and times on every device)."""
    exes, lazy, eager = _step_graphs(_mlp, device="pfvm:cpu", policy=policy)
    (exe,) = exes
    torch.testing.assert_close(lazy[0], eager[0], rtol=RTOL, atol=ATOL)
    hw, c = _json_values("hardware.json"), _json_values("costs.json")
    bw = hw["dram_bw_per_group"] * hw["dram_groups"] * c["dram_efficiency"]
    model = cost_model()
    for k in exe.kernels:
        assert k.fmt == FORMATS[policy]["complex" if k.kind == "complex" else "other"], (k.kind, k.fmt)
        if k.kind == "view" and k.time_s == 0:  # a layout reinterpretation: no traffic, no time
            assert k.bytes == 0 and k.flops == 0
            continue
        read = sum(_storage_bytes(n.meta["mn"][0], policy) for n in k.inputs if n.meta["mn"][0] is not None)
        assert k.bytes == read + _written(k, policy)
        if k.kind == "complex":
            rate = hw["peak_flops"][k.fmt] * c["matmul_efficiency"]
        else:
            rate = hw["vector_flops"][k.fmt] * c["vector_efficiency"]
        compute, memory = k.flops / rate, k.bytes / bw
        assert k.time_s == pytest.approx(max(compute, memory) + c["kernel_overhead_s"], rel=1e-12)
        assert k.bound == ("compute" if compute >= memory else "memory")
        assert k.time_s == pytest.approx(model.kernel(k.kind, k.flops, k.bytes, k.fmt).seconds, rel=1e-12)
    st = exe.stats
    assert st["policy"] == exe.policy == policy
    assert st["bytes"] == sum(k.bytes for k in exe.kernels)
    assert st["modelled_s"] == pytest.approx(sum(k.time_s for k in exe.kernels) + c["launch_overhead_s"], rel=1e-12)
    assert exe.modelled_s == st["modelled_s"]
    assert st["compute_bound_s"] == pytest.approx(sum(k.time_s for k in exe.kernels if k.bound == "compute"))


def test_storage_width_follows_the_policy(env):
    (f,), _, _ = _step_graphs(_mlp, device="pfvm:cpu", policy="float")
    (h,), _, _ = _step_graphs(_mlp, device="pfvm:cpu", policy="half")
    (d,), _, _ = _step_graphs(_mlp, device="pfvm:cpu", policy="double")
    # float tensors are stored 2 / 4 / 8 bytes wide; the int64 labels keep their width
    assert h.stats["bytes"] < f.stats["bytes"] < d.stats["bytes"]
    for exe, width in ((h, 2), (f, 4), (d, 8)):
        labels = [n for n in exe.gm.graph.nodes if n.op == "placeholder" and n.meta["mn"][0] is not None
                  and not n.meta["mn"][0][2].is_floating_point]
        floats = [n for n in exe.gm.graph.nodes if n.op == "placeholder" and n.meta["mn"][0] is not None
                  and n.meta["mn"][0][2].is_floating_point]
        placed = {p.name: p for p in exe.plan.placements}
        for n in floats:
            assert placed[n.name].size == -(-math.prod(n.meta["mn"][0][0]) * width // 64) * 64
        for n in labels:
            assert placed[n.name].size == -(-math.prod(n.meta["mn"][0][0]) * 8 // 64) * 64
    assert h.plan.peak_bytes < f.plan.peak_bytes < d.plan.peak_bytes
    assert h.stats["flops"] == f.stats["flops"] == d.stats["flops"]


# ---------------------------------------------------------------------------------------------
# codegen directory and mncore-dump


def _lazy_codegen_run(env, tmp_path) -> tuple[Path, list]:
    """Two SGD-momentum steps (two graphs: the first creates the momentum buffers) with MNCORE_CODEGEN_DIR."""
    root = tmp_path / "codegen"
    env.setenv("MNCORE_CODEGEN_DIR", str(root))
    mncore.init("emu2")
    compile_cache.clear()
    model, _, (x, y), loss_fn = _mlp()
    m = copy.deepcopy(model).mncore()
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(m, x.mncore(), y.mncore()).backward()
        opt.step()
        mncore.sync()
    mncore.wait_device_ops()
    return root, list(compile_cache.values())


def _dram(s: str) -> tuple[int, int]:
    m = re.fullmatch(r"DRAM@(\d+)-(\d+)", s or "")
    assert m, s
    return int(m.group(1)), int(m.group(2))


def test_lazy_codegen_dir_has_one_directory_per_graph(env, tmp_path):
    root, exes = _lazy_codegen_run(env, tmp_path)
    assert len(exes) == 2
    assert sorted(p.name for p in root.iterdir()) == sorted(e.name for e in exes)
    for exe in exes:
        d = root / exe.name
        assert {"manifest.json", "program.txt", "graph.py"} <= {p.name for p in d.iterdir()}
        man = json.loads((d / "manifest.json").read_text())
        assert man["graph"] == exe.name and man["device"] == "emu2" and man["precision_policy"] == "float"
        assert man["versions"]["torch"] == torch.__version__ and man["versions"]["mncore"] == mncore.__version__
        assert man["versions"]["compiler"] == exe.stats["compiler_version"]
        placed = {p.name: p for p in exe.plan.placements}
        placeholders = [n for n in exe.gm.graph.nodes if n.op == "placeholder" and n.meta["mn"][0] is not None]
        out_node = next(n for n in exe.gm.graph.nodes if n.op == "output")
        assert len(man["inputs"]) == len(placeholders) and len(man["outputs"]) == len(out_node.args[0])
        for io, node in zip(man["inputs"] + man["outputs"], placeholders + list(out_node.args[0])):
            shape, stride, dtype = node.meta["mn"][0]
            assert io["shape"] == list(shape) and io["dtype"] == str(dtype).removeprefix("torch.")
            assert io["layout"] == {"kind": "RowMajor", "strides": list(stride)}
            assert io["name"]
            start, end = _dram(io["dram"])
            if node.name in placed:
                assert (start, end) == (placed[node.name].start, placed[node.name].end)
            assert end - start >= _storage_bytes(node.meta["mn"][0], "float")
        assert [k["kernel"] for k in man["kernels"]] == list(range(len(exe.kernels)))
        assert [k["kind"] for k in man["kernels"]] == [k.kind for k in exe.kernels]
        assert man["memory_plan"]["peak_bytes"] == exe.plan.peak_bytes
        assert len(man["memory_plan"]["values"]) == len(exe.plan.placements)
        assert man["stats"]["kernels"] == len(exe.kernels) and man["stats"]["flops"] == exe.stats["flops"]
        assert (d / "graph.py").read_text() == exe.gm.code
        program = (d / "program.txt").read_text()
        assert program.startswith(f"# {exe.name}: {len(exe.kernels)} kernels")
        assert len(re.findall(r"^kernel \d+ \[", program, re.M)) == len(exe.kernels)


def test_codegen_files_over_the_threshold_are_zstd(env, tmp_path):
    root, exes = _lazy_codegen_run(env, tmp_path)
    exe = exes[0]
    d = tmp_path / "small"
    env.setattr(codegen, "ZSTD_THRESHOLD", 64)
    codegen.write(d, exe, codegen.manifest(exe, mncore.settings.device))
    names = {p.name for p in d.iterdir()}
    assert {"graph.py.zst", "program.txt.zst", "manifest.json"} <= names and "graph.py" not in names
    raw = zstandard.ZstdDecompressor().decompress((d / "graph.py.zst").read_bytes()).decode()
    assert raw == exe.gm.code == codegen.read_text(d, "graph.py")
    assert codegen.read_text(d, "program.txt") == codegen.program_text(exe)
    env.setattr(codegen, "ZSTD_THRESHOLD", 1 << 20)  # rewriting small: the stale .zst goes away
    codegen.write(d, exe, codegen.manifest(exe, mncore.settings.device))
    names = {p.name for p in d.iterdir()}
    assert "graph.py" in names and "graph.py.zst" not in names and "program.txt.zst" not in names


def _dump_command() -> list[str]:
    script = Path(sys.executable).parent / "mncore-dump"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mncore.compile.dump"]


def test_mncore_dump_prints_the_manifest(env, tmp_path, capsys):
    root, exes = _lazy_codegen_run(env, tmp_path)
    exe = max(exes, key=lambda e: len(e.kernels))
    p = subprocess.run(_dump_command() + [str(root / exe.name)], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("MNCORE_")})
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert out.startswith(f"graph {exe.name} on emu2 precision=float ")
    man = json.loads((root / exe.name / "manifest.json").read_text())
    for io in man["inputs"] + man["outputs"]:
        assert f"  {io['name']}: {io['dram']}/" in out
    assert f"kernels: {len(exe.kernels)} (" in out
    assert len(re.findall(r"^  #\d+ ", out, re.M)) == len(exe.kernels)
    assert f"memory plan: peak {exe.plan.peak_bytes:,} bytes" in out
    assert "passes: cse_eliminated=" in out
    # the module's entry point prints the same; --no-kernels drops the kernel lines
    assert dump.main([str(root / exe.name)]) == 0
    assert capsys.readouterr().out == out
    assert dump.main([str(root / exe.name), "--no-kernels"]) == 0
    short = capsys.readouterr().out
    assert not re.findall(r"^  #\d+ ", short, re.M) and f"kernels: {len(exe.kernels)} (" in short


def test_mncore_dump_on_a_directory_without_manifest(tmp_path, capsys):
    """No codegen output: the message says what writes one; a lazy-mode root: it names the graphs' directories."""
    assert dump.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "Context.compile" in err and "MNCORE_CODEGEN_DIR" in err
    assert dump.main([str(tmp_path)]) == 2
    assert "holds no manifest.json (not a codegen directory)" in capsys.readouterr().err
    for name in ("graph_a", "graph_b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert dump.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "2 codegen directories" in err and str(tmp_path / "graph_a") in err and str(tmp_path / "graph_b") in err
    with pytest.raises(SystemExit) as stop:
        dump.main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"mncore-dump (mncore) {mncore.__version__}"
    with pytest.raises(SystemExit):
        dump.main(["--help"])
    assert "example:\n  python examples/context/add.py && mncore-dump /tmp/add_two_tensors" in capsys.readouterr().out


def test_codegen_dir_has_model_onnx_when_requested(env, tmp_path):
    """With MNCORE_CODEGEN_ONNX=1 and the onnx extra (a dev dependency), model.onnx holds the graph:
    ONNX's own reference evaluator reproduces eager's result from it."""
    onnx = pytest.importorskip("onnx", reason="the onnx extra is part of the dev install")
    from onnx.reference import ReferenceEvaluator
    from mncore.context import Context, MNDevice

    env.setenv("MNCORE_CODEGEN_ONNX", "1")
    ctx = Context(MNDevice("pfvm:cpu"))
    Context.switch_context(ctx)
    x = torch.randn(3, 8)
    ctx.compile(lambda i: {"out": torch.softmax(i["x"] @ i["x"].T, -1)}, {"x": x}, tmp_path / "cg")
    man = json.loads((tmp_path / "cg" / "manifest.json").read_text())
    assert man["onnx"] == {"written": True, "file": "model.onnx"}
    model = onnx.load(str(tmp_path / "cg" / "model.onnx"))
    (got,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), torch.softmax(x @ x.T, -1), rtol=1e-5, atol=1e-6)


def test_codegen_dir_says_why_there_is_no_model_onnx(env, tmp_path):
    """A training step's foreach optimizer update has no ONNX translation: the manifest says so."""
    pytest.importorskip("onnxscript", reason="the onnx extra is part of the dev install")
    env.setenv("MNCORE_CODEGEN_ONNX", "1")
    env.setenv("MNCORE_CODEGEN_DIR", str(tmp_path / "lazy"))
    mncore.init("emu2")
    lin = torch.nn.Linear(4, 2).mncore()
    opt = torch.optim.SGD(lin.parameters(), lr=0.1, foreach=True)
    lin(torch.randn(3, 4).mncore()).sum().backward()
    opt.step()
    mncore.sync()
    mncore.wait_device_ops()
    reasons = [json.loads(m.read_text())["onnx"] for m in (tmp_path / "lazy").glob("*/manifest.json")]
    assert reasons and all(not r["written"] and r["reason"] for r in reasons)
    assert not list((tmp_path / "lazy").glob("*/model.onnx"))


def test_a_built_in_substitute_is_classed_and_costed_as_the_op_it_runs():
    """Found when a substitute for ``_grouped_mm`` lost the emulated board's operand rounding: the kernels mncore
    runs for some ops are plain functions, and the compiler took them for elementwise code (max-pooling's
    gradient was fused and timed as an elementwise kernel, fused optimizer steps too)."""
    from mncore.compile.fusion import op_class
    from mncore.compile.lowering import lower

    aten = torch.ops.aten
    for op in (aten.max_pool2d_with_indices_backward.default, aten.embedding_dense_backward.default,
               aten._grouped_mm.default, aten.histc.default, aten._ctc_loss.Tensor):
        assert lower(op) is not op and base_op(lower(op)) is op
        assert op_class(lower(op)) == op_class(op) != "elementwise", op
    from mncore.ir import ops
    from mncore.ir.targets import MutateFn

    adam = aten._fused_adam_.default  # traced as a wrapper that writes its lists, around a substitute
    wrapper = MutateFn(adam, ops.info_for(adam))
    assert base_op(lower(wrapper)) is adam and op_class(lower(wrapper)) == op_class(wrapper) == "opaque"
