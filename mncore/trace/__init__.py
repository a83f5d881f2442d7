"""Lazy mode: ``LazyTensor`` and ``__torch_dispatch__``, views, writes, host reads, RNG, ``sync()``.

``tensor`` is imported first: it imports the handlers, which use the class it defines.
"""
from mncore.trace import tensor  # noqa: F401  (import order: see above)
from mncore.trace.register import register
from mncore.trace.runtime import init, init_cpu, init_cuda, init_mncore, parse_device
from mncore.trace.sync import graph_for, sync, wait_device_ops
from mncore.trace.tensor import LazyTensor

__all__ = ["LazyTensor", "graph_for", "init", "init_cpu", "init_cuda", "init_mncore", "parse_device", "register",
           "sync", "wait_device_ops"]
