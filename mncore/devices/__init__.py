"""Execution devices behind the ``mncore`` torch device: one module per kind behind ``base.Device``."""
from mncore.devices.base import Device, KernelFailed, RunResult
from mncore.devices.registry import active, attach, available, parse, register, unregister

__all__ = ["Device", "KernelFailed", "RunResult", "active", "attach", "available", "parse", "register", "unregister"]
