"""``mncore.observe``: read-only views of the runtime for tools (the harness, the shape registry).

Everything a tool may look at without importing mncore's internals: device memory held by live
tensors, op observers told about every traced op, and the executables compiled so far.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from mncore.lazy import graph as _graph
from mncore.lazy import tensor as _tensor
from mncore.runtime import buffers as _buffers

OpObserver = Callable[[Any, tuple, dict], None]


def live_bytes() -> int:
    """Bytes held by every live device buffer (a running total, O(1))."""
    return _buffers.live_bytes()


def live_buffers() -> int:
    """Number of live device buffers."""
    return _buffers.live()


def add_op_observer(fn: OpObserver) -> None:
    """Call ``fn(op, args, kwargs)`` for every op the tracer records from now on."""
    _tensor.tracer.observers.append(fn)


def remove_op_observer(fn: OpObserver) -> None:
    """Stop calling ``fn`` (no error if it was not added)."""
    with contextlib.suppress(ValueError):
        _tensor.tracer.observers.remove(fn)


@contextlib.contextmanager
def op_observer(fn: OpObserver) -> Iterator[OpObserver]:
    """``with observe.op_observer(fn):`` observe the ops traced inside the block."""
    add_op_observer(fn)
    try:
        yield fn
    finally:
        remove_op_observer(fn)


def arg_meta(a: Any) -> tuple | None:
    """(shape, stride, dtype) of a traced tensor argument seen by an op observer, else None."""
    return _tensor.arg_meta(a)


def executables() -> list[dict[str, Any]]:
    """Name and compiler statistics of every executable in the in-memory compile cache."""
    return [{"name": exe.name, "stats": dict(exe.stats)} for exe in _graph.cache.values()]


def clear_compile_cache() -> None:
    """Drop every executable from the in-memory compile cache (the disk cache is untouched)."""
    _graph.cache.clear()
