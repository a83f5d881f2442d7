"""Lazy mode: the ``mncore`` torch device, the tracer and ``sync()``."""
