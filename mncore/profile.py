"""``mncore.profile``: timeline export (host trace, compile and device lanes)."""
from mncore.observe.timeline import clear, events, export_chrome_trace, now

__all__ = ["clear", "events", "export_chrome_trace", "now"]
