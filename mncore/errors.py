"""Every exception and warning mncore raises to users, in one place (catch them from here)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A knob (environment variable or ``init`` argument) has a value it does not accept."""


class NotInitializedError(RuntimeError):
    """A tensor was put on the ``mncore`` device before ``mncore.init``."""


class ImplicitSyncError(RuntimeError):
    """Raised in ``implicit_sync='error'`` mode when a value is read before ``mncore.sync()``."""


class ImplicitSyncWarning(UserWarning):
    """A host read forced a sync of the pending graph (graph cut mid-step)."""


class CaptureWarning(UserWarning):
    """``mncore.capture`` keeps tracing a step it cannot replay honestly; the warning says why and where."""


class CaptureError(RuntimeError):
    """``mncore.capture(strict=True)``: the step cannot be replayed (it ran, traced, and its values are right)."""


class DeviceExecutionError(RuntimeError):
    """A graph failed on the device; names the graph and the op that failed."""


class StaticShapeError(RuntimeError):
    """A graph holds a value whose shape is not known at compile time (emu2/mncore2 need static shapes)."""


class NotCompilableError(RuntimeError):
    """A Context function cannot become one static graph (an op whose output shape depends on values);
    names the op and the user source line. Run such a step in lazy mode."""


class GuardError(RuntimeError):
    """A value a Context function read on the host at compile time changed at a call, and no further
    variant may be compiled (``MNCORE_CONTEXT_VARIANTS``); names the read and its source line."""


class HostFallbackWarning(UserWarning):
    """An op a static-shape device cannot hold in a graph ran on the host (shown once per call site)."""


class LayoutError(TypeError):
    """A tensor of a layout mncore has no buffers for (sparse COO/CSR/CSC/BSR/BSC, mkldnn): names the layout
    and the fix (``.to_dense()`` first, or keep the sparse work on the CPU)."""


def layout_error(layout: object, what: str) -> LayoutError:
    """The one message of an unsupported layout (uploads and ops producing one say the same)."""
    return LayoutError(f"mncore supports only strided (dense) tensors, but {what} has layout {layout}; convert it "
                       f"with .to_dense() before moving it to mncore, or keep the {layout} work on the CPU")


class DeviceOutOfMemoryError(MemoryError):
    """A graph's memory plan does not fit the device DRAM left free by live tensors."""


class BoardLockTimeout(TimeoutError):
    """A board stayed locked by another process for longer than ``MNCORE_LOCK_TIMEOUT``."""


class CacheLockTimeout(TimeoutError):
    """Another process held a cache entry's compile lock for longer than ``MNCORE_LOCK_TIMEOUT``."""


class CacheCorruptWarning(UserWarning):
    """A cache entry failed its checksum or could not be decoded; it is recompiled and replaced."""


class DirectoryError(OSError):
    """A directory mncore writes to (compile cache, codegen, board locks) is not a usable directory."""


class InputError(KeyError):
    """A Context call or compile got inputs that do not match the compiled sample (names the key)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
