"""``mncore.metrics``: counters, timings and a readable report of the runtime."""
from mncore.observe.metrics import COUNTERS, TIMINGS, capture_retraces, counters, fallback_ops, report, reset

__all__ = ["COUNTERS", "TIMINGS", "capture_retraces", "counters", "fallback_ops", "report", "reset"]
