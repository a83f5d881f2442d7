"""The compile cache's in-memory LRU: recency, its bound, and one key comparison per hit."""
from __future__ import annotations

import pytest

from mncore.cache.lru import LRUCache

pytestmark = pytest.mark.unit


class _Key:
    """Equal by value, never the same object: counts how often a look-up compares it with another."""

    compared = 0

    def __init__(self, v: int):
        self.v = v

    def __hash__(self) -> int:
        return hash(self.v)

    def __eq__(self, other: object) -> bool:
        _Key.compared += 1
        return isinstance(other, _Key) and other.v == self.v


def test_the_least_recently_used_entry_goes_first():
    lru = LRUCache(capacity=2)
    lru.put(_Key(1), "one")
    lru.put(_Key(2), "two")
    assert lru.get(_Key(1)) == "one"  # 1 is now the most recent: 2 goes when 3 comes
    lru.put(_Key(3), "three")
    assert lru.get(_Key(2)) is None
    assert lru.get(_Key(1)) == "one" and lru.get(_Key(3)) == "three"
    assert len(lru) == 2 and sorted(lru.values()) == ["one", "three"]


def test_putting_a_key_again_replaces_its_value_and_makes_it_recent():
    lru = LRUCache(capacity=2)
    lru.put(_Key(1), "old")
    lru.put(_Key(2), "two")
    lru.put(_Key(1), "new")
    lru.put(_Key(3), "three")
    assert lru.get(_Key(1)) == "new" and lru.get(_Key(2)) is None


def test_a_hit_compares_the_new_key_with_the_stored_one_once():
    """A graph key's comparison walks every node of the graph: a hit must not pay it twice."""
    lru = LRUCache(capacity=4)
    for v in range(3):
        lru.put(_Key(v), v)
    _Key.compared = 0
    assert lru.get(_Key(1)) == 1
    assert _Key.compared == 1
    lru.put(_Key(9), 9)
    lru.put(_Key(10), 10)  # over the bound: the oldest (0) goes, 1 was used since
    assert lru.get(_Key(0)) is None and lru.get(_Key(1)) == 1
