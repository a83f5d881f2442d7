"""In-memory LRU of executables keyed by the structural graph key."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mncore import config


class LRUCache:
    """Bounded mapping; the least recently used executable is dropped first.

    The bound is ``capacity`` or, when None, ``MNCORE_CACHE_SIZE`` read at each insertion.
    """

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Any) -> Any:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        capacity = self.capacity or config.get("cache_size")
        while len(self._d) > capacity:
            self._d.popitem(last=False)

    def values(self) -> list:
        return list(self._d.values())

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
