"""The buffer table: every device-resident tensor, keyed by buffer id.

Data leaves own their entry and free it when their last reference dies, so the number of
live buffers is a direct measure of device memory held by Python objects.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

_table: dict[int, Any] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def new_id() -> int:
    return next(_ids)


def put(bid: int, tensor: Any) -> None:
    _table[bid] = tensor


def get(bid: int) -> Any:
    try:
        return _table[bid]
    except KeyError:
        raise RuntimeError(f"mncore: buffer {bid} is not on the device (freed or never written)") from None


def free(bid: int) -> None:
    _table.pop(bid, None)


def live() -> int:
    return len(_table)


def live_bytes() -> int:
    return sum(t.numel() * t.element_size() for t in list(_table.values()))


def migrate(fn: Callable[[Any], Any]) -> None:
    """Apply ``fn`` to every buffer (used when ``init`` switches the execution device)."""
    with _lock:
        for bid, t in list(_table.items()):
            _table[bid] = fn(t)
