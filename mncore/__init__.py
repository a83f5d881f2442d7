"""mncore: a PyTorch backend for a compile-first accelerator.

Lazy mode: ``mncore.init_cpu()``, put tensors and modules on the ``mncore`` device with
``.mncore()`` / ``.to("mncore")``, and call ``mncore.sync()`` once per training step.
"""
from __future__ import annotations

import os

from mncore.devices.registry import parse as _parse_device
from mncore.lazy import device as _device
from mncore.lazy.graph import sync, wait_device_ops
from mncore.lazy.tensor import ImplicitSyncError, ImplicitSyncWarning, LazyTensor, tracer as _tracer
from mncore.runtime import buffers as _buffers
from mncore.runtime.executor import DeviceExecutionError
from mncore.runtime.state import EXECUTION_MODES, IMPLICIT_SYNC_MODES, debug_flags, settings

from mncore import metrics, profile  # noqa: E402  (public submodules)

__all__ = [
    "init", "init_cpu", "init_cuda", "init_mncore", "sync", "wait_device_ops", "metrics", "profile",
    "LazyTensor", "ImplicitSyncError", "ImplicitSyncWarning", "DeviceExecutionError", "settings",
]

_device.register()


def init(device: str = "mncore2:auto", *, implicit_sync: str | None = None, execution: str | None = None) -> None:
    """Choose the execution device and modes; a second call syncs and drains pending work first.

    ``implicit_sync``: 'error' | 'warn' (default) | 'silent' (or env ``MNCORE_IMPLICIT_SYNC``).
    ``execution``: 'async' (default) | 'async_naive' | 'sync'.
    """
    spec = _parse_device(device)
    mode = implicit_sync or os.environ.get("MNCORE_IMPLICIT_SYNC", "warn")
    if mode not in IMPLICIT_SYNC_MODES:
        raise ValueError(f"implicit_sync must be one of {', '.join(IMPLICIT_SYNC_MODES)}; got {mode!r}")
    execution = execution or os.environ.get("MNCORE_EXECUTION", "async")
    if execution not in EXECUTION_MODES:
        raise ValueError(f"execution must be one of {', '.join(EXECUTION_MODES)}; got {execution!r}")
    if settings.device is not None:
        sync()
        wait_device_ops()
        if spec.exec_device != settings.exec_device:
            _buffers.migrate(lambda t: t.to(spec.exec_device))
    settings.device = spec.name
    settings.exec_device = spec.exec_device
    settings.implicit_sync = mode
    settings.execution = execution
    settings.debug = debug_flags()
    _tracer.record_frames = "recompile" in settings.debug


def init_cpu(**kwargs) -> None:
    """Run graphs with PyTorch CPU kernels (``pfvm:cpu``)."""
    init("pfvm:cpu", **kwargs)


def init_cuda(index: int = 0, **kwargs) -> None:
    """Run graphs with PyTorch CUDA kernels (``pfvm:cuda:N``)."""
    init(f"pfvm:cuda:{index}", **kwargs)


def init_mncore(**kwargs) -> None:
    """Run on an MN-Core 2 board (``mncore2:auto``)."""
    init("mncore2:auto", **kwargs)
