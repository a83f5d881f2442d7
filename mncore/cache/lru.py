"""In-memory LRU of executables keyed by the structural graph key."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mncore import config


class LRUCache:
    """Bounded mapping; the least recently used executable is dropped first.

    The bound is ``capacity`` or, when None, ``MNCORE_CACHE_SIZE`` read at each insertion. Each entry
    keeps its own key beside its value: a hit moves the entry by that stored key, which the dict finds
    by identity, so the new key is compared with the stored one once per look-up, not twice (for a
    graph key that comparison walks every node).
    """

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Any) -> Any:
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(hit[0])
        return hit[1]

    def put(self, key: Any, value: Any) -> None:
        self._d.pop(key, None)  # a replaced entry keeps no other key object than the one stored with it
        self._d[key] = (key, value)
        capacity = self.capacity or config.get("cache_size")
        while len(self._d) > capacity:
            self._d.popitem(last=False)

    def values(self) -> list:
        return [v for _, v in self._d.values()]

    def __len__(self) -> int:
        return len(self._d)

    def clear(self) -> None:
        self._d.clear()
