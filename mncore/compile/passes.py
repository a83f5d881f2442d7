"""Graph clean-up passes on the functional FX graph: CSE with constant deduplication, then DCE.

The traced graph is purely functional (in-place ops were turned into functional twins and
random ops take their seed as an input), so two nodes with the same target and the same
arguments compute the same value and one can replace the other.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx


def _freeze(x: Any) -> Any:
    """A hashable stand-in for an argument; raises TypeError for values that cannot be compared."""
    if isinstance(x, fx.Node):
        return ("node", x)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_freeze(y) for y in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _freeze(v)) for k, v in sorted(x.items()))
    if isinstance(x, slice):
        return ("slice", _freeze(x.start), _freeze(x.stop), _freeze(x.step))
    if isinstance(x, torch.Tensor):
        raise TypeError("tensor constant")
    if isinstance(x, float) and x != x:
        return ("nan",)
    hash(x)
    return (type(x).__name__, x)


def _has_node(x: Any) -> bool:
    if isinstance(x, fx.Node):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_node(y) for y in x)
    if isinstance(x, dict):
        return any(_has_node(y) for y in x.values())
    return False


def cse(graph: fx.Graph) -> dict[str, int]:
    """Merge identical nodes; nodes with no tensor inputs (factories) count as deduplicated constants."""
    seen: dict[Any, fx.Node] = {}
    stats = {"cse_eliminated": 0, "constants_deduplicated": 0}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        try:
            key = (node.target, _freeze(node.args), _freeze(node.kwargs))
        except TypeError:
            continue
        other = seen.get(key)
        if other is None:
            seen[key] = node
            continue
        constant = not _has_node(node.args) and not _has_node(node.kwargs)
        node.replace_all_uses_with(other)
        graph.erase_node(node)
        stats["constants_deduplicated" if constant else "cse_eliminated"] += 1
    return stats


def dce(graph: fx.Graph) -> int:
    """Remove nodes whose values reach no output; returns how many were removed."""
    before = len(graph.nodes)
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users:
            graph.erase_node(node)
    return before - len(graph.nodes)


def drop_double_transposes(graph: fx.Graph) -> int:
    """Replace ``t(t(x))`` by ``x``; returns how many were replaced (dead inner ``t``s are removed too).

    Autograd's backward of ``linear`` transposes the transposed weight again, and lazy mode hands the
    optimizer ``t(t(mm))`` of each weight gradient: the seed MLP's step held 13 such views among its
    62 ops. ``t(t(x))`` is a view of ``x`` with ``x``'s own sizes, strides and offset, so reading ``x``
    gives the same values. Run on the code devices execute, not on the graph the compiler models
    (whose kernels, memory plan and cost stay as traced)."""
    t = torch.ops.aten.t.default
    replaced = 0
    for node in list(graph.nodes):
        inner = node.args[0] if node.op == "call_function" and node.target is t else None
        if isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target is t:
            node.replace_all_uses_with(inner.args[0])
            graph.erase_node(node)
            if not inner.users:
                graph.erase_node(inner)
            replaced += 1
    return replaced


def run(graph: fx.Graph) -> dict[str, int]:
    """CSE then DCE (CSE leaves no dead nodes itself, but traced graphs can hold unused values)."""
    stats = cse(graph)
    stats["dce_eliminated"] = dce(graph)
    return stats
