"""``mncore.observe``: read-only views of the runtime for tools (the harness, the shape registry).

Everything a tool may look at without importing mncore's internals: device memory held by live
tensors, op observers told about every traced op, graph observers told about every executable
submitted.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from mncore.observe import metrics
from mncore.observe.hooks import GraphObserver, OpObserver, graph_observers, op_observers

__all__ = ["live_bytes", "live_buffers", "add_op_observer", "remove_op_observer", "op_observer",
           "graph_observer", "arg_meta", "metrics"]


def live_bytes() -> int:
    """Bytes held by every live device buffer (a running total, O(1))."""
    return metrics.gauge("live_bytes")


def live_buffers() -> int:
    """Number of live device buffers."""
    return metrics.gauge("live_buffers")


def add_op_observer(fn: OpObserver) -> None:
    """Call ``fn(op, args, kwargs)`` for every op the tracer records from now on."""
    op_observers.append(fn)


def remove_op_observer(fn: OpObserver) -> None:
    """Stop calling ``fn`` (no error if it was not added)."""
    with contextlib.suppress(ValueError):
        op_observers.remove(fn)


@contextlib.contextmanager
def op_observer(fn: OpObserver) -> Iterator[OpObserver]:
    """``with observe.op_observer(fn):`` observe the ops traced inside the block."""
    add_op_observer(fn)
    try:
        yield fn
    finally:
        remove_op_observer(fn)


@contextlib.contextmanager
def graph_observer(fn: GraphObserver) -> Iterator[GraphObserver]:
    """``with observe.graph_observer(fn):`` ``fn(summary)`` for every executable submitted in the block."""
    graph_observers.append(fn)
    try:
        yield fn
    finally:
        with contextlib.suppress(ValueError):
            graph_observers.remove(fn)


def arg_meta(a: Any) -> tuple | None:
    """(shape, stride, dtype) of a traced tensor argument seen by an op observer, else None."""
    return getattr(a, "mn_meta", None)
