"""Graph collection at a cut: which nodes, in which order, wired how, and the graph's stable name.

``collect`` marks nodes on the nodes themselves (a pass number and a position) instead of id-keyed
sets; these tests hold it to a plain set-based reachability written here, from several threads at
once, and hold the stable name (which keys the disk cache) to the formula earlier versions used.
"""
from __future__ import annotations

import hashlib
import threading

import pytest
import torch

import mncore
from mncore.graph.collect import collect
from mncore.graph.key import graph_key, stable_name
from mncore.ir.values import Data, Node

pytestmark = pytest.mark.unit


def _reference(refs: list[tuple]) -> tuple[list[Node], tuple, tuple]:
    """Reachable nodes in trace order, their key items and outputs, computed with sets and dicts."""
    seen: dict[int, Node] = {}
    stack = [r[0] for r in refs]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        stack += [ref[0] for ref in n.inputs if type(ref) is tuple and type(ref[0]) is Node]
    order = sorted(seen.values(), key=lambda n: n.seq)
    local = {id(n): j for j, n in enumerate(order)}
    leaves: dict[int, int] = {}
    items = []
    for n in order:
        codes = []
        for ref in n.inputs:
            if type(ref) is not tuple:
                codes.append(None)
            elif type(ref[0]) is Node:
                j, i = local[id(ref[0])], ref[1]
                codes.append((j, i) if i else j)
            else:
                codes.append(-1 - leaves.setdefault(id(ref[0]), len(leaves)))
        items.append((n.sig.id, tuple(codes)))
    return order, tuple(items), tuple((local[id(r[0])], r[1]) for r in refs)


def _pending_refs(*tensors: torch.Tensor) -> list[tuple]:
    refs = [t.mn_storage.value for t in tensors]
    assert all(type(r[0]) is Node for r in refs), "the test needs traced, not yet computed, values"
    return refs


def _traced_graph(seed: int) -> tuple[list[tuple], list[torch.Tensor]]:
    """A small traced graph with a multi-output op (max over a dim: values, indices), a leaf read twice
    and a lifted scalar; returns its roots and the tensors that keep them pending."""
    torch.manual_seed(seed)
    x = torch.randn(4, 5).to("mncore")
    w = torch.randn(5, 3).to("mncore")
    values, indices = torch.max(x @ w, dim=0)
    y = (values * 0.5 + indices.float()).relu() + x.sum()
    z = torch.cat([values, y]) * 2.5
    return _pending_refs(y, z, indices), [x, w, values, indices, y, z]


def test_collect_matches_set_based_reachability():
    refs, keep = _traced_graph(0)
    g = collect(refs)
    order, items, outputs = _reference(refs)
    assert [id(n) for n in g.order] == [id(n) for n in order]
    assert g.items == items and g.outputs == outputs
    assert any(type(c) is tuple for _, codes in g.items for c in codes), "indices (output 1) must keep its tuple"
    assert len(g.leaves) == 2 and all(type(d) is Data for d in g.leaves)
    assert collect(refs).items == g.items  # a second pass over the same nodes sees them afresh
    del keep
    mncore.sync()


def test_collect_from_several_threads_at_once():
    """Passes over shared nodes from several threads (a Context compile may run beside a cut)."""
    refs, keep = _traced_graph(1)
    expected = _reference(refs)
    subsets = [refs[:1], refs[1:], refs]
    wanted = [_reference(r) for r in subsets]
    errors: list[str] = []

    def work(k: int) -> None:
        for i in range(200):
            r, (order, items, outputs) = subsets[(k + i) % 3], wanted[(k + i) % 3]
            g = collect(r)
            if [id(n) for n in g.order] != [id(n) for n in order] or g.items != items or g.outputs != outputs:
                errors.append(f"thread {k}, pass {i}: wrong graph")
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert collect(refs).items == expected[1]
    del keep
    mncore.sync()


def test_stable_name_is_the_one_earlier_versions_gave():
    """The disk cache is keyed by this name: the wiring is hashed as ``(node, output)`` pairs, whatever
    form the in-memory key takes."""
    refs, keep = _traced_graph(2)
    g = collect(refs)
    options = ("mncore2", "cpu", (), "float32", 7)
    local = {id(n): j for j, n in enumerate(g.order)}
    leaves = {id(d): k for k, d in enumerate(g.leaves)}
    h = hashlib.sha256()
    for n in g.order:
        wiring = tuple(None if type(r) is not tuple else (local[id(r[0])], r[1]) if type(r[0]) is Node
                       else -1 - leaves[id(r[0])] for r in n.inputs)
        h.update(repr((getattr(n.target, "__name__", str(n.target)), n.template, wiring, n.sig.key[3])).encode())
    h.update(repr((g.outputs,) + options[:-1]).encode())
    assert stable_name(g, graph_key(g, options)) == "graph_" + h.hexdigest()[:16]
    del keep
    mncore.sync()


def test_graphs_that_differ_only_in_which_output_they_read_are_different_graphs():
    """Output 0 of a node is keyed without a tuple and output 1 with one: two graphs that read the
    one or the other output of ``aminmax`` (same shapes and dtypes) must not share an executable."""
    torch.manual_seed(3)
    x = torch.randn(6, 4)
    lx = x.to("mncore")
    mncore.sync()
    compiles = mncore.metrics.counters()["compiles"]
    a = torch.aminmax(lx, dim=0).min + 1
    mncore.sync()
    b = torch.aminmax(lx, dim=0).max + 1
    mncore.sync()
    assert mncore.metrics.counters()["compiles"] == compiles + 2
    torch.testing.assert_close(a.cpu(), x.amin(dim=0) + 1)
    torch.testing.assert_close(b.cpu(), x.amax(dim=0) + 1)
