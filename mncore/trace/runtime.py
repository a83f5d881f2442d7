"""``mncore.init``: attach a device and choose the execution and precision modes for lazy mode."""
from __future__ import annotations

import torch

from mncore import config
from mncore.config import settings
from mncore.devices import registry
from mncore.errors import NotInitializedError
from mncore.ir import buffers
from mncore.trace import gcpolicy
from mncore.trace.state import tracer
from mncore.trace.sync import sync, wait_device_ops


def init(device: str | None = None, *, implicit_sync: str | None = None, execution: str | None = None,
         sim_mode: str | None = None, float_dtype: str | None = None, fallback: str | None = None,
         backward_thread: str | None = None) -> None:
    """Choose the execution device and modes; a second call syncs and drains pending work first.

    ``device``: default ``MNCORE_DEVICE`` (``mncore2:auto``); without any ``init`` call, the first
    tensor put on the device attaches that default (``_init_on_first_use``).

    ``implicit_sync``: 'error' | 'warn' (default) | 'silent' (or env ``MNCORE_IMPLICIT_SYNC``).
    ``execution``: 'async' (default) | 'async_naive' | 'sync' (or env ``MNCORE_EXECUTION``).
    ``sim_mode`` (emu2/mncore2): 'functional' (default) | 'performance' (or env ``MNCORE_SIM_MODE``).
    ``float_dtype``: lazy mode's precision policy, 'float' (default) | 'mixed' | 'half' | 'double'
    (or env ``MNCORE_FLOAT_DTYPE``); the numerics follow it on emu2/mncore2.
    ``fallback`` (emu2/mncore2): what an op with a data-dependent output shape does: 'warn' (default:
    it runs on the host, warning once per call site) | 'silent' | 'error' (or env ``MNCORE_FALLBACK``).
    ``backward_thread``: 'caller' (default: ``backward()`` runs on the thread that calls it, as for CPU
    tensors) | 'device' (PyTorch's per-device autograd thread) (or env ``MNCORE_BACKWARD_THREAD``); it is
    set for the thread that calls ``init`` (``torch.autograd.set_multithreading_enabled`` is per thread).
    """
    dev = registry.parse(config.resolve("device", device))
    sim_mode = config.resolve("sim_mode", sim_mode)
    float_dtype = config.resolve("float_dtype", float_dtype)
    mode = config.resolve("implicit_sync", implicit_sync)
    execution = config.resolve("execution", execution)
    fallback = config.resolve("fallback", fallback)
    backward_thread = config.resolve("backward_thread", backward_thread)
    debug = config.get("debug")
    gcpolicy.at_init()
    if settings.device is not None:
        sync()
        wait_device_ops()
    dev = registry.attach(dev)  # a failure leaves the previous device attached
    if settings.device is not None and dev.exec_device != settings.exec_device:
        buffers.migrate(lambda t: t.to(dev.exec_device))
    dev.sim_mode = sim_mode
    settings.device = dev.name
    settings.kind = dev.kind
    settings.exec_device = dev.exec_device
    settings.simulated = dev.simulated
    settings.static_shapes = dev.static_shapes
    settings.sim_mode = sim_mode
    settings.float_dtype = float_dtype
    settings.implicit_sync = mode
    settings.execution = execution
    settings.backward_thread = backward_thread
    # the device's autograd thread would trace backward while this one waits: each op's GIL hand-off costs
    torch.autograd.set_multithreading_enabled(backward_thread == "device")
    settings.fallback = fallback
    settings.debug = debug
    tracer.record_frames = "recompile" in debug


def _init_on_first_use() -> None:
    with tracer.lock:  # two threads may reach the device first at once
        if settings.device is None:
            try:
                init()
            except (ValueError, OSError) as e:
                raise NotInitializedError(
                    f"mncore was used before mncore.init(), and its default device (MNCORE_DEVICE="
                    f"{config.get('device')!r}) cannot be attached: {e}. Call mncore.init(device=...) first "
                    "or set MNCORE_DEVICE") from e


config.on_first_use(_init_on_first_use)


def init_cpu(**kwargs) -> None:
    """Run graphs with PyTorch CPU kernels (``pfvm:cpu``)."""
    init("pfvm:cpu", **kwargs)


def init_cuda(index: int = 0, **kwargs) -> None:
    """Run graphs with PyTorch CUDA kernels (``pfvm:cuda:N``)."""
    init(f"pfvm:cuda:{index}", **kwargs)


def init_mncore(**kwargs) -> None:
    """Run on an MN-Core 2 board (``mncore2:auto``: the first free simulated board)."""
    init("mncore2:auto", **kwargs)


def parse_device(spec: str) -> str:
    """The canonical name of a device string; ``ValueError`` listing the valid ones when it is not."""
    return registry.parse(spec).name
