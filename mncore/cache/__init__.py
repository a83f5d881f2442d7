"""Executables by graph key: memory LRU, crash-safe disk cache shared between processes, serialization."""
from mncore.cache.lookup import executable_for, memory

__all__ = ["executable_for", "memory"]
