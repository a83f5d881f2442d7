"""Collect the pending graph that computes a set of root values, in trace order, with its leaves."""
from __future__ import annotations

from dataclasses import dataclass

from mncore.ir.values import Data, Node, Scalar


@dataclass(eq=False)
class Collected:
    """A graph ready to key and compile: nodes in trace order, the leaves and lifted scalars it reads
    (placeholder order), the structural items of its key and the (node, output) pairs it returns."""

    order: list[Node]
    leaves: list[Data]
    scalars: list[Scalar]
    items: tuple
    outputs: tuple[tuple[int, int], ...]


def collect(refs: list[tuple]) -> Collected:
    """The nodes reachable from ``refs`` (values ``(node, index)``), numbered, with their wiring.

    Each item of the key is ``(sig id, input codes)``: a code is ``(local node, output)`` for a
    node input, ``-1 - k`` for the k-th leaf (so aliasing of inputs is part of the structure) and
    None for a lifted scalar.
    """
    seen: set = set()
    order: list[Node] = []
    stack = [r[0] for r in refs]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        order.append(n)
        for ref in n.inputs:
            if type(ref) is tuple:
                p = ref[0]
                if type(p) is Node and id(p) not in seen:
                    stack.append(p)
    order.sort(key=lambda n: n.seq)
    local: dict[int, int] = {}
    leaf_idx: dict[int, int] = {}
    leaves: list[Data] = []
    scalars: list = []
    items = []
    for j, n in enumerate(order):
        local[id(n)] = j
        codes = []
        for ref in n.inputs:
            if isinstance(ref, Scalar):
                scalars.append(ref)
                codes.append(None)
                continue
            p, i = ref
            if type(p) is Node:
                codes.append((local[id(p)], i))
            else:
                k = leaf_idx.get(id(p))
                if k is None:
                    k = leaf_idx[id(p)] = len(leaves)
                    leaves.append(p)
                codes.append(-1 - k)
        items.append((n.sig.id, tuple(codes)))
    outputs = tuple((local[id(r[0])], r[1]) for r in refs)
    return Collected(order, leaves, scalars, tuple(items), outputs)
