"""In-memory LRU of executables keyed by the structural graph key."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any


class LRUCache:
    """Bounded mapping; the least recently used executable is dropped first."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity or int(os.environ.get("MNCORE_CACHE_SIZE", "1024"))
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Any) -> Any:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: Any, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    def values(self) -> list:
        return list(self._d.values())

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
