"""Turn a compiled FX graph into plain picklable data and back (for the disk cache).

aten overloads do not pickle, and the tracer's random-op and mutating-op wrappers hold them, so
graph targets are written as names and resolved again on load (a built-in substitute by the op it
runs, as it is lowered again then). A target that cannot be named
(a user's ``register_lowering`` override) makes the graph uncacheable: ``NotSerializable``.
"""
from __future__ import annotations

import builtins
import importlib
import types
from typing import Any

import torch
import torch.fx as fx

from mncore.compile import lowering
from mncore.compile.fusion import base_op
from mncore.ir import ops as opinfo
from mncore.ir.targets import MutateFn, Seeded


class NotSerializable(Exception):
    """The graph holds a target or constant that cannot be written to the disk cache."""


def _resolve_op(name: str) -> torch._ops.OpOverload:
    ns, op, overload = name.split(".", 2)
    return getattr(getattr(getattr(torch.ops, ns), op), overload)


def encode_target(t: Any) -> tuple:
    if isinstance(t, torch._ops.OpOverload):
        return ("op", str(t))
    if isinstance(t, Seeded):
        return ("seeded", encode_target(t.fn), encode_target(t.op))
    op = base_op(t)  # a built-in substitute (often a closure) or a wrapper around one: named by its op
    if isinstance(t, MutateFn):
        if not isinstance(op, torch._ops.OpOverload):
            raise NotSerializable(f"graph target {t!r} runs a kernel that cannot be named (a register_lowering "
                                  "override?)")
        return ("mutate", encode_target(op))  # lowered again on load
    if isinstance(op, torch._ops.OpOverload) and lowering.lower(op) is t:
        return ("lowered", str(op))
    module, qual = getattr(t, "__module__", None), getattr(t, "__qualname__", "")
    if module and qual and "<" not in qual:
        try:
            obj = importlib.import_module(module)
            for part in qual.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            obj = None
        if obj is t:
            return ("py", module, qual)
    raise NotSerializable(f"graph target {t!r} cannot be named (a register_lowering override?)")


def decode_target(code: tuple) -> Any:
    kind = code[0]
    if kind == "op":
        return _resolve_op(code[1])
    if kind == "seeded":
        return Seeded(decode_target(code[1]), decode_target(code[2]))
    if kind == "lowered":
        return lowering.lower(_resolve_op(code[1]))
    if kind == "mutate":
        op = decode_target(code[1])
        return lowering.lower(MutateFn(op, opinfo.info_for(op)))
    obj = importlib.import_module(code[1])
    for part in code[2].split("."):
        obj = getattr(obj, part)
    return obj


class _NodeRef(tuple):
    """Marks a reference to the i-th graph node inside encoded arguments."""


def encode_graph(graph: fx.Graph) -> list[tuple]:
    """One tuple per node: (op, name, target code, args, kwargs, meta)."""
    index = {n: i for i, n in enumerate(graph.nodes)}
    out = []
    for n in graph.nodes:
        args, kwargs = _encode_args(n.args, index), _encode_args(n.kwargs, index)
        target = encode_target(n.target) if n.op == "call_function" else n.target
        meta = {k: v for k, v in n.meta.items() if k.startswith("mn")}
        out.append((n.op, n.name, target, args, kwargs, meta))
    return out


def _encode_args(x: Any, index: dict) -> Any:
    if isinstance(x, fx.Node):
        return _NodeRef((index[x],))
    if isinstance(x, (list, tuple)):
        return (list if isinstance(x, list) else tuple)(_encode_args(y, index) for y in x)
    if isinstance(x, dict):
        return {k: _encode_args(v, index) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_encode_args(x.start, index), _encode_args(x.stop, index), _encode_args(x.step, index))
    return x


def _decode_args(x: Any, nodes: list[fx.Node]) -> Any:
    if isinstance(x, _NodeRef):
        return nodes[x[0]]
    if isinstance(x, (list, tuple)):
        return type(x)(_decode_args(y, nodes) for y in x)
    if isinstance(x, dict):
        return {k: _decode_args(v, nodes) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_decode_args(x.start, nodes), _decode_args(x.stop, nodes), _decode_args(x.step, nodes))
    return x


def decode_graph(rows: list[tuple]) -> fx.Graph:
    g = fx.Graph()
    nodes: list[fx.Node] = []
    for op, name, target, args, kwargs, meta in rows:
        args, kwargs = _decode_args(args, nodes), _decode_args(kwargs, nodes)
        if op == "placeholder":
            n = g.placeholder(name)
        elif op == "output":
            n = g.output(args[0])
        else:
            n = g.create_node(op, decode_target(target) if op == "call_function" else target, args, kwargs, name=name)
        n.meta.update(meta)
        nodes.append(n)
    return g


def encode_globals(g: dict[str, Any]) -> dict[str, tuple]:
    """The globals of FX-generated code (modules, types, numbers and graph targets) as names."""
    out = {}
    for k, v in g.items():
        if k == "__builtins__":
            continue
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = ("value", v)
        elif isinstance(v, types.ModuleType):
            out[k] = ("module", v.__name__)
        elif v is type(None):
            out[k] = ("none_type",)
        else:
            out[k] = ("target", encode_target(v))
    return out


def decode_globals(g: dict[str, tuple]) -> dict[str, Any]:
    out: dict[str, Any] = {"__builtins__": builtins}
    for k, code in g.items():
        kind = code[0]
        out[k] = (code[1] if kind == "value" else importlib.import_module(code[1]) if kind == "module"
                  else type(None) if kind == "none_type" else decode_target(code[1]))
    return out
