"""Public hooks: op observers (the shape registry records through them) and graph observers.

The tracer calls every op observer with ``(op, args, kwargs)`` for each op it records; the
executor calls every graph observer with a summary dict (``name``, ``nodes``, ``stats``) of each
executable it is handed. Lists are read on the hot path only when non-empty.
"""
from __future__ import annotations

from typing import Any, Callable

OpObserver = Callable[[Any, tuple, dict], None]
GraphObserver = Callable[[dict], None]

op_observers: list[OpObserver] = []
graph_observers: list[GraphObserver] = []
