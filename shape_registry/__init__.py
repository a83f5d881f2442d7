"""The shape registry: every aten op (with argument metadata) that real models ask a device to run."""
from shape_registry.format import FORMAT_VERSION, Entry, Registry
from shape_registry.record import EagerRecorder, LazyRecorder

__all__ = ["FORMAT_VERSION", "EagerRecorder", "Entry", "LazyRecorder", "Registry"]
