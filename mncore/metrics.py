"""``mncore.metrics``: counters, timings and a readable report of the runtime."""
from mncore.runtime.metrics import counters, fallback_ops, report, reset

__all__ = ["counters", "fallback_ops", "report", "reset"]
