"""The compiler: traced graph -> passes -> fusion -> precision -> cost -> memory plan -> executable."""
from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

from mncore.compile import fusion, memory_plan, passes, precision, reinplace
from mncore.compile.executable import Executable
from mncore.compile.fingerprint import compiler_version
from mncore.errors import StaticShapeError
from mncore.sim.cost import cost_model, costs_path

def _check_static(graph: fx.Graph, name: str) -> None:
    for n in graph.nodes:
        for m in n.meta.get("mn") or ():
            if m is not None and not all(type(s) is int for s in m.shape):
                raise StaticShapeError(f"mncore: graph {name}: op {n.target} (node {n.name}) has the dynamic shape "
                                       f"{list(m.shape)}; MN-Core graphs need every shape fixed at compile time")


def _autocast_half(k: Any) -> bool:
    """Every complex op of kernel ``k`` reads 16-bit operands only (an autocast region)."""
    ops = [n for n in k.nodes if n.meta.get("mn_class") == "complex"]
    return bool(ops) and all(precision.half_operands(n) for n in ops)


def _host_bytes(node: fx.Node) -> int:
    """Bytes a value occupies as a host-side buffer (its own dtype), for device-memory accounting."""
    m = (node.meta.get("mn") or [None])[0]
    return 0 if m is None else math.prod(m.shape) * m.dtype.itemsize


def _value_bytes(node: fx.Node, policy: str) -> int:
    return sum(precision.storage_bytes(m, policy) for m in node.meta.get("mn") or ())


def _storage_base(node: fx.Node, members: set) -> fx.Node:
    """The value of the same kernel whose buffer ``node`` reinterprets (itself when it is no view of one)."""
    while (node.target is not operator.getitem and fusion.is_view(node.target) and node.args
           and isinstance(node.args[0], fx.Node) and node.args[0] in members):
        node = node.args[0]
    return node


def _written_bytes(k: Any, alias: dict, policy: str) -> int:
    """Bytes kernel ``k`` writes to DRAM, each buffer once. An output that is a view of another value of
    the kernel shares that value's buffer (lazy mode returns a weight's gradient ``mm`` as ``.grad`` while
    the optimizer reads ``t(t(mm))``): beside its base it aliases the base in the memory plan and adds no
    bytes; views of a base that is not an output write at most the base."""
    members = set(k.nodes)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for o in k.outputs:
        groups.setdefault(_storage_base(o, members), []).append(o)
    total = 0
    for base, outs in groups.items():
        if base in outs:
            alias.update((o, base) for o in outs if o is not base)
            total += _value_bytes(base, policy)
        else:
            total += min(_value_bytes(base, policy), sum(_value_bytes(o, policy) for o in outs))
    return total


def _plan_values(graph: fx.Graph, kernels: list, home: dict, alias: dict, policy: str) -> list[tuple]:
    """(name, bytes, first kernel, last kernel) of every DRAM value; views extend their base's life."""
    n_k = len(kernels)
    last: dict[fx.Node, int] = {}
    first: dict[fx.Node, int] = {}
    for n in graph.nodes:
        if n.op == "placeholder" and (n.meta.get("mn") or [None])[0] is not None:
            first[n], last[n] = -1, n_k
    for k in kernels:
        for o in k.outputs:
            use = max((n_k if u.op == "output" else home.get(u, n_k) for u in o.users), default=k.index)
            root = alias.get(o, o)
            if root is o:
                first[o] = k.index
            last[root] = max(last.get(root, k.index), use)
    return [(n.name, _value_bytes(n, policy), first[n], last[n]) for n in first]


def compile_graph(graph: fx.Graph, name: str, key: Any, policy: str, static_shapes: bool) -> Executable:
    """Optimise ``graph`` in place and build its executable with kernels, plan and modelled cost.

    Pure: everything it depends on is an argument (the cost model reads its documented files).
    """
    precision.check_policy(policy)
    if static_shapes:
        _check_static(graph, name)
    stats: dict[str, Any] = passes.run(graph)
    kernels = fusion.fuse(graph)
    model = cost_model()
    home = {n: k.index for k in kernels for n in k.nodes}
    n_k = len(kernels)
    alias: dict[fx.Node, fx.Node] = {}  # views (view kernels, views beside their base) -> the buffer they reinterpret
    for k in kernels:
        k.fmt = precision.kernel_format(policy, k.kind, k.kind == "complex" and _autocast_half(k))
        if k.kind == "view":
            base = k.inputs[0] if len(k.inputs) == 1 else None
            for o in k.outputs:
                if base is not None:
                    alias[o] = alias.get(base, base)
            if base is not None:
                continue
        k.bytes = sum(_value_bytes(n, policy) for n in k.inputs) + _written_bytes(k, alias, policy)
        c = model.kernel(k.kind, k.flops, k.bytes, k.fmt)
        k.time_s, k.bound = c.seconds, c.bound
    plan = memory_plan.plan(_plan_values(graph, kernels, home, alias, policy), n_k)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    compute = sum(k.time_s for k in kernels)
    stats.update({
        "nodes": sum(1 for n in graph.nodes if n.op == "call_function"),
        "kernels": n_k,
        "kernels_by_kind": {kind: sum(1 for k in kernels if k.kind == kind) for kind in
                            ("view", "injective", "elementwise", "reduction", "complex", "opaque")},
        "flops": sum(k.flops for k in kernels),
        "bytes": sum(k.bytes for k in kernels),
        "modelled_s": compute + model.launch_s,
        "compute_bound_s": sum(k.time_s for k in kernels if k.bound == "compute"),
        "peak_bytes": plan.peak_bytes,
        "input_host_bytes": sum(_host_bytes(n) for n in graph.nodes if n.op == "placeholder"),
        "policy": policy,
        "compiler_version": compiler_version(costs_path()),
        "torch": torch.__version__,
    })
    run = _runnable(graph)
    stats["transposes_dropped"] = passes.drop_double_transposes(run.graph)
    stats["reinplaced"] = reinplace.reinplace(run.graph)
    run.recompile()
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    return Executable.from_graph_module(gm, kernels, name=name, n_nodes=stats["nodes"], key=key, policy=policy,
                                        plan=plan, stats=stats, forward=type(run).forward, code=run.code,
                                        output_metas=[n.meta["mn"][0] for n in out_node.args[0]])


def _runnable(graph: fx.Graph) -> fx.GraphModule:
    """A copy of ``graph`` for the code devices run (re-inplacing rewrites it; the graph stays functional)."""
    copy = fx.Graph()
    copy.output(copy.graph_copy(graph, {}))
    return fx.GraphModule(torch.nn.Module(), copy)
