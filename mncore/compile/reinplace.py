"""Re-inplacing for the code that runs the graph: an out-of-place op whose first argument is a fresh
intermediate that nothing reads afterwards writes into that argument instead of a new tensor.

Why: the traced graph is functional, so a training step's optimizer allocates a new tensor for every
intermediate of every parameter (AdamW on GPT-2 small: ~1,000 fresh 0.5-150 MB tensors per step). On
a CPU each fresh allocation is page-faulted in as it is first written, which made those ops several
times slower than eager PyTorch's in-place ones (``benchmarks/reinplace.py`` measures both forms).

Only what the graph itself created is written: never a program input (the caller's parameters, data
and the values a failed job falls back to), never a graph output, never a value some view shares. The
graph the compiler analyses (kernels, memory plan, modelled cost, the emulator) stays functional; only
the generated code devices run (pfvm) changes. In-place and out-of-place ATen kernels compute the same
values, so results are bit-identical (tested against the functional graph).
"""
from __future__ import annotations

import functools
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

# Ops whose schema says their result is new memory while it shares its input's (a view made for a
# temporary): their results are never taken as fresh.
_UNDECLARED_VIEWS = frozenset({"aten::_unsafe_view"})


@functools.lru_cache(maxsize=None)
def _inplace_twin(op: Any) -> Any:
    """The in-place overload of a pointwise or ``_foreach_`` ATen op with the same arguments, or None."""
    if not isinstance(op, torch._ops.OpOverload) or op.namespace != "aten":
        return None
    name = op._schema.name.split("::", 1)[1]
    if name.endswith("_") or not (name.startswith("_foreach_") or torch.Tag.pointwise in op.tags):
        return None
    try:
        twin = getattr(getattr(torch.ops.aten, name + "_"), op._overloadname)
    except AttributeError:
        return None
    ours, theirs = op._schema.arguments, twin._schema.arguments
    if [(a.name, str(a.type)) for a in ours] != [(a.name, str(a.type)) for a in theirs]:
        return None
    first = theirs[0].alias_info if theirs else None
    if first is None or not first.is_write or any(a.alias_info is not None for a in theirs[1:]):
        return None
    return twin


def _fresh_result(node: fx.Node) -> bool:
    """Whether ``node``'s value is memory no other value of the graph shares (an op's own new result)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        src, i = node.args
        return isinstance(src, fx.Node) and isinstance(i, int) and _fresh_returns(src, i)
    return _fresh_returns(node, 0)


def _fresh_returns(node: fx.Node, i: int) -> bool:
    op = node.target
    if not isinstance(op, torch._ops.OpOverload) or op._schema.name in _UNDECLARED_VIEWS:
        return False
    returns = op._schema.returns
    if len(returns) == 1 and isinstance(returns[0].type, torch.ListType):  # Tensor[]: one declaration
        i = 0
    return i < len(returns) and returns[i].alias_info is None


def _arg_counts(node: fx.Node) -> Counter:
    """How many times each value is passed to ``node`` (a value written must not be read as another argument)."""
    counts: Counter = Counter()
    fx.node.map_arg((node.args, node.kwargs), lambda a: counts.update((a,)))
    return counts


def _writable(value: Any, node: fx.Node, meta: Any, seen: _Seen, counts: Counter) -> bool:
    """``node`` may write its result into ``value``: a fresh intermediate with the result's shape, strides and
    dtype, passed once, that every other reader has read already and that no view shares (every earlier
    reader made new memory of its own, or wrote into ``value`` itself)."""
    if meta is None or not isinstance(value, fx.Node) or value not in seen.fresh or value.meta["mn"][0] != meta:
        return False
    if counts[value] != 1:
        return False
    at = seen.order[node]
    return all(u is node or seen.order[u] < at and (u in seen.rewritten or _fresh_result(u)) for u in value.users)


@dataclass
class _Seen:
    """The walk so far: each node's position, the fresh values made, the nodes rewritten."""

    order: dict[fx.Node, int]
    fresh: set[fx.Node] = field(default_factory=set)
    rewritten: set[fx.Node] = field(default_factory=set)


def reinplace(graph: fx.Graph) -> int:
    """Rewrite ``graph`` in place; returns how many ops now write into their first argument."""
    seen = _Seen({n: i for i, n in enumerate(graph.nodes)})
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        twin = _inplace_twin(node.target)
        if twin is not None and _rewrite(graph, node, twin, seen):
            seen.rewritten.add(node)
        if node in seen.rewritten and not isinstance(node.args[0], (list, tuple)) or _fresh_result(node):
            seen.fresh.add(node)  # an op written in place returns its (fresh) first argument
    return len(seen.rewritten)


def _rewrite(graph: fx.Graph, node: fx.Node, twin: Any, seen: _Seen) -> bool:
    first = node.args[0] if node.args else None
    metas = node.meta.get("mn") or []
    if isinstance(first, (list, tuple)):  # a _foreach_ op: every element, and its results read by index
        items = [u for u in node.users]
        if not first or len(metas) != len(first) or any(
                u.target is not operator.getitem or not isinstance(u.args[1], int) for u in items):
            return False
        counts = _arg_counts(node)
        if not all(_writable(v, node, m, seen, counts) for v, m in zip(first, metas)):
            return False
        node.target = twin
        for u in items:
            u.replace_all_uses_with(first[u.args[1]])
            graph.erase_node(u)
        return True
    if not metas or not _writable(first, node, metas[0], seen, _arg_counts(node)):
        return False
    node.target = twin  # returns its first argument: the node's readers read that
    return True
