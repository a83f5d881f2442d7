"""Turn a collected graph plan into a ``torch.fx.Graph`` whose nodes carry their output metadata.

Every node gets ``meta["mn"]``: a list of ``TensorMeta`` per output (``None`` for non-tensor
outputs and for lifted scalars), taken from the node's own signature, so the compiler passes
never re-run shape inference.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from mncore.compile.lowering import lower
from mncore.graph.collect import Collected
from mncore.ir.values import DEV, Data, Scalar, ScalarMarker, T


def build(c: Collected, exec_device: torch.device) -> fx.Graph:
    """Build the FX graph: placeholders are leaves then lifted scalars; the output is a tuple."""
    nodes, n_leaves, n_scalars, outputs = c.order, len(c.leaves), len(c.scalars), c.outputs
    g = fx.Graph()
    leaves = [g.placeholder(f"buf{i}") for i in range(n_leaves)]
    scalars = [g.placeholder(f"scalar{i}") for i in range(n_scalars)]
    for p in scalars:
        p.meta["mn"] = [None]
    env: list[Any] = []
    items: dict[tuple[int, int], Any] = {}
    leaf_index: dict[int, int] = {}
    local: dict[int, int] = {}
    sc = iter(scalars)

    def ref_value(ref: Any) -> Any:
        if isinstance(ref, Scalar):
            return next(sc)
        p, i = ref
        if type(p) is Data:
            return leaves[leaf_index[id(p)]]
        j = local[id(p)]
        if nodes[j].nout == 0:
            return env[j]
        key = (j, i)
        v = items.get(key)
        if v is None:
            v = items[key] = g.call_function(operator.getitem, (env[j], i))
            v.meta["mn"] = [env[j].meta["mn"][i]]
        return v

    def rebuild(x: Any, it: Any) -> Any:
        if x is T or type(x) is ScalarMarker:
            return ref_value(next(it))
        if type(x) is tuple:
            return [rebuild(y, it) for y in x]
        if x is DEV:
            return exec_device
        return x

    next_leaf = 0
    for j, n in enumerate(nodes):
        local[id(n)] = j
        for ref in n.inputs:
            if type(ref) is tuple and type(ref[0]) is Data and id(ref[0]) not in leaf_index:
                leaf_index[id(ref[0])] = next_leaf
                leaves[next_leaf].meta["mn"] = [ref[0].meta]
                next_leaf += 1
        it = iter(n.inputs)
        targs, tkw = n.template
        args = tuple(rebuild(a, it) for a in targs)
        kwargs = {k: rebuild(v, it) for k, v in tkw}
        node = g.call_function(lower(n.target), args, kwargs)
        node.meta["mn"] = list(n.sig.metas)
        node.meta["mn_site"] = n.sig.site
        node.meta["mn_tuple"] = n.nout != 0
        env.append(node)
    g.output(tuple(env[j] if nodes[j].nout == 0 else ref_value((nodes[j], i)) for j, i in outputs))
    return g
