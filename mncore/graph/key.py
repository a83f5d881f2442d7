"""``GraphKey``: the structure of a graph and its compile options, never its values.

Built once per graph cut and hashed once: cache look-ups compare the stored hash first and the
parts only on a hash match, instead of rehashing a tuple of every node on each look-up.
"""
from __future__ import annotations

import hashlib
from mncore.graph.collect import Collected


class GraphKey:
    """``items`` (per node: op signature id and input wiring), ``outputs`` and ``options``
    (device kind, execution device type, compile options, precision policy, lowering version)."""

    __slots__ = ("items", "outputs", "options", "_hash")

    def __init__(self, items: tuple, outputs: tuple, options: tuple):
        self.items = items
        self.outputs = outputs
        self.options = options
        self._hash = hash((items, outputs, options))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, GraphKey) and self._hash == other._hash
                                 and self.options == other.options and self.outputs == other.outputs
                                 and self.items == other.items)

    def __repr__(self) -> str:
        return f"GraphKey({len(self.items)} ops, {len(self.outputs)} outputs, {self.options})"


def graph_key(g: Collected, options: tuple) -> GraphKey:
    return GraphKey(g.items, g.outputs, options)


def stable_name(g: Collected, key: GraphKey) -> str:
    """A name that is the same in every process for the same graph (it also keys the disk cache).

    Signature ids are per process, so the name hashes what they stand for: each op's target,
    template, wiring and input metadata, then the outputs and the options.
    """
    h = hashlib.sha256()
    for n, item in zip(g.order, key.items):
        h.update(repr((getattr(n.target, "__name__", str(n.target)), n.template, _wiring(item[1]), n.sig.key[3])).encode())
    h.update(repr((key.outputs,) + _without_lowering_version(key.options)).encode())
    return "graph_" + h.hexdigest()[:16]


def _wiring(codes: tuple) -> tuple:
    """Input codes as they were written before a node's first output lost its tuple (names, and the
    disk cache they key, stay those of earlier versions)."""
    return tuple((c, 0) if type(c) is int and c >= 0 else c for c in codes)


def _without_lowering_version(options: tuple) -> tuple:
    return options[:-1]

