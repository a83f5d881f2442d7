"""The buffer table: every device-resident tensor, keyed by buffer id.

Data leaves own their entry and free it when their last reference dies, so the number of
live buffers is a direct measure of device memory held by Python objects.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

from mncore.observe import metrics

_table: dict[int, Any] = {}
_sizes: dict[int, int] = {}  # bytes of each entry, so that freeing one never calls into torch
ids = itertools.count(1)  # buffer ids: each Data leaf takes the next one
_lock = threading.RLock()  # re-entrant: a Data.__del__ run by the GC inside a locked section frees too
_total = [0]  # bytes held by every buffer, kept up to date so device-memory checks are O(1)


def _nbytes(t: Any) -> int:
    return getattr(t, "nbytes", 0)  # a tensor's numel() * element_size(), in one attribute read


def put(bid: int, tensor: Any) -> None:
    """One buffer (an upload's, a host value's): ``put_new`` without building its lists."""
    size = _nbytes(tensor)
    with _lock:
        _total[0] += size - _sizes.get(bid, 0)
        _table[bid] = tensor
        _sizes[bid] = size


def put_new(bids: list[int], tensors: Any, sizes: list[int]) -> None:
    """New buffers (a new leaf's, a job's outputs) with their sizes, under one lock: bulk dictionary
    updates, not a loop in Python (a replayed training step writes one output per parameter, gradient
    and optimizer buffer; GPT-2 small's step, hundreds)."""
    with _lock:
        before = len(_table)
        _table.update(zip(bids, tensors))
        if len(_table) - before != len(bids):  # an id written before: its old size must not be counted
            for bid in bids:
                _total[0] -= _sizes.get(bid, 0)
        _sizes.update(zip(bids, sizes))
        _total[0] += sum(sizes)


def get(bid: int) -> Any:
    try:
        return _table[bid]
    except KeyError:
        raise RuntimeError(f"mncore: buffer {bid} is not on the device (freed or never written)") from None


def free(bid: int) -> None:
    with _lock:
        if _table.pop(bid, None) is not None:
            _total[0] -= _sizes.pop(bid)


def live() -> int:
    return len(_table)


def live_bytes() -> int:
    """Bytes held by all device buffers (a running total)."""
    return _total[0]


def migrate(fn: Callable[[Any], Any]) -> None:
    """Apply ``fn`` to every buffer (used when ``init`` switches the execution device)."""
    with _lock:
        for bid, t in list(_table.items()):
            _table[bid] = fn(t)
            _sizes[bid] = _nbytes(_table[bid])
        _total[0] = sum(_sizes.values())


metrics.register_gauge("live_buffers", live)
metrics.register_gauge("live_bytes", live_bytes)
