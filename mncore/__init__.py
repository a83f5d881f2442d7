"""mncore: a PyTorch backend for a compile-first accelerator.

Lazy mode: ``mncore.init_cpu()``, put tensors and modules on the ``mncore`` device with
``.mncore()`` / ``.to("mncore")``, and call ``mncore.sync()`` once per training step.
The Context API is ``mncore.context``. This module is the public API only.
"""
from __future__ import annotations

from mncore import config, errors, metrics, observe, profile
from mncore._version import __version__
from mncore.capture import capture
from mncore.compile.lowering import register_lowering, unregister_lowering
from mncore.config import settings
from mncore.devices import Device, RunResult
from mncore.devices.registry import register as register_device
from mncore.devices.registry import unregister as unregister_device
from mncore.errors import (CaptureError, CaptureWarning, DeviceExecutionError, HostFallbackWarning, ImplicitSyncError,
                           ImplicitSyncWarning)
from mncore.trace import (LazyTensor, init, init_cpu, init_cuda, init_mncore, parse_device, register, sync,
                          wait_device_ops)

__all__ = [
    "init", "init_cpu", "init_cuda", "init_mncore", "sync", "wait_device_ops", "metrics", "profile", "observe",
    "config", "errors", "LazyTensor", "ImplicitSyncError", "ImplicitSyncWarning", "DeviceExecutionError",
    "settings", "parse_device", "register_lowering", "unregister_lowering", "register_device",
    "unregister_device", "Device", "RunResult", "__version__", "capture", "CaptureError", "CaptureWarning",
    "HostFallbackWarning",
]

register()
