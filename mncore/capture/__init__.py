"""Step capture: ``mncore.capture(step)`` replays a repeating step's graph without tracing it again."""
from mncore.capture.api import Captured, capture

__all__ = ["Captured", "capture"]
