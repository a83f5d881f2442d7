"""Collect the pending graph that computes a set of root values, in trace order, with its leaves."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from operator import attrgetter

from mncore.ir.values import Data, Node, Scalar

_SEQ = attrgetter("seq")  # trace order
_passes = itertools.count()
_marking = threading.Lock()  # a pass's marks live on the nodes: one pass at a time (Context compiles run on any thread)


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
    node input (the local node alone for its output 0), ``-1 - k`` for the k-th leaf (so aliasing of inputs is part of the structure) and
    None for a lifted scalar.
    """
    with _marking:
        stamp = next(_passes)  # marks the nodes this pass visited
        order: list[Node] = []
        keep = order.append
        stack = [r[0] for r in refs]
        pop, push = stack.pop, stack.append
        while stack:  # once per node of every traced step: the methods above are looked up once
            n = pop()
            if n.visit == stamp:
                continue
            n.visit = stamp
            keep(n)
            for ref in n.inputs:
                if type(ref) is tuple:
                    p = ref[0]
                    if type(p) is Node and p.visit != stamp:
                        push(p)
        order.sort(key=_SEQ)
        leaf_idx: dict[int, int] = {}
        leaves: list[Data] = []
        scalars: list = []
        items = []
        for j, n in enumerate(order):
            n.local = j  # producers come first in trace order, so every input's position is set
            codes = []
            for ref in n.inputs:
                if type(ref) is not tuple:  # a lifted scalar (or seed); every other input is a (value, index) pair
                    scalars.append(ref)
                    codes.append(None)
                    continue
                p, i = ref
                if type(p) is Node:
                    codes.append((p.local, i) if i else p.local)  # no tuple for the common first output
                else:
                    k = leaf_idx.get(id(p))
                    if k is None:
                        k = leaf_idx[id(p)] = len(leaves)
                        leaves.append(p)
                    codes.append(-1 - k)
            items.append((n.sig.id, tuple(codes)))
        outputs = tuple((r[0].local, r[1]) for r in refs)
    return Collected(order, leaves, scalars, tuple(items), outputs)
