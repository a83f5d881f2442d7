"""mncore: a PyTorch backend for a compile-first accelerator.

Lazy mode: ``mncore.init_cpu()``, put tensors and modules on the ``mncore`` device with
``.mncore()`` / ``.to("mncore")``, and call ``mncore.sync()`` once per training step.
"""
from __future__ import annotations

import os

from mncore.compiler import precision as _precision
from mncore.devices import sim as _sim
from mncore.devices.registry import parse as _parse_device
from mncore.lazy import device as _device
from mncore.lazy.graph import sync, wait_device_ops
from mncore.lazy.tensor import ImplicitSyncError, ImplicitSyncWarning, LazyTensor, tracer as _tracer
from mncore.runtime import buffers as _buffers
from mncore.runtime.executor import DeviceExecutionError
from mncore.runtime.state import EXECUTION_MODES, IMPLICIT_SYNC_MODES, SIM_MODES, debug_flags, settings

from mncore import config, metrics, observe, profile  # noqa: E402  (public submodules)

__all__ = [
    "init", "init_cpu", "init_cuda", "init_mncore", "sync", "wait_device_ops", "metrics", "profile",
    "LazyTensor", "ImplicitSyncError", "ImplicitSyncWarning", "DeviceExecutionError", "settings", "config",
    "observe", "parse_device",
]

__version__ = "0.2.0"

_device.register()


def init(device: str = "mncore2:auto", *, implicit_sync: str | None = None, execution: str | None = None,
         sim_mode: str | None = None, float_dtype: str | None = None) -> None:
    """Choose the execution device and modes; a second call syncs and drains pending work first.

    ``implicit_sync``: 'error' | 'warn' (default) | 'silent' (or env ``MNCORE_IMPLICIT_SYNC``).
    ``execution``: 'async' (default) | 'async_naive' | 'sync' (or env ``MNCORE_EXECUTION``).
    ``sim_mode`` (emu2/mncore2): 'functional' (default) | 'performance' (or env ``MNCORE_SIM_MODE``).
    ``float_dtype``: lazy mode's precision policy, 'float' (default) | 'mixed' | 'half' | 'double'
    (or env ``MNCORE_FLOAT_DTYPE``); the numerics follow it on emu2/mncore2.
    """
    spec = _parse_device(device)
    sim_mode = sim_mode or os.environ.get("MNCORE_SIM_MODE", "functional")
    if sim_mode not in SIM_MODES:
        raise ValueError(f"sim_mode must be one of {', '.join(SIM_MODES)}; got {sim_mode!r}")
    float_dtype = _precision.check_policy(float_dtype or os.environ.get("MNCORE_FLOAT_DTYPE", "float"))
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
    settings.device = _sim.attach(spec.name)
    settings.kind = spec.kind
    settings.sim_mode = sim_mode
    settings.float_dtype = float_dtype
    settings.exec_device = spec.exec_device
    settings.implicit_sync = mode
    settings.execution = execution
    settings.debug = debug_flags()
    _tracer.record_frames = "recompile" in settings.debug


def parse_device(spec: str) -> str:
    """The canonical name of a device string; ``ValueError`` listing the valid ones when it is not."""
    return _parse_device(spec).name


def init_cpu(**kwargs) -> None:
    """Run graphs with PyTorch CPU kernels (``pfvm:cpu``)."""
    init("pfvm:cpu", **kwargs)


def init_cuda(index: int = 0, **kwargs) -> None:
    """Run graphs with PyTorch CUDA kernels (``pfvm:cuda:N``)."""
    init(f"pfvm:cuda:{index}", **kwargs)


def init_mncore(**kwargs) -> None:
    """Run on an MN-Core 2 board (``mncore2:auto``: the first free simulated board)."""
    init("mncore2:auto", **kwargs)
