"""The device interface: what the runtime needs from anything that runs executables.

A device is named by a string (``pfvm:cpu``, ``emu2``, ``mncore2:0``, or a kind registered by a
plugin or test), executes on a torch device (where its buffers live), says whether it needs
static shapes, checks that a graph fits its memory, and runs an executable on a list of
arguments. It never sees lazy tensors or the tracer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.fx as fx

from mncore.compile.executable import Executable


class KernelFailed(Exception):
    """A device raises this with the failing FX node attached; the executor names the op."""

    def __init__(self, node: fx.Node, kernel: int, exc: BaseException):
        super().__init__(f"{exc}")
        self.node, self.kernel, self.exc = node, kernel, exc


@dataclass
class RunResult:
    """Outputs of one job, and its time: ``modelled_s`` with its (start, end) on the
    ``time.perf_counter`` clock for simulated devices; ``measured_lane`` names the timeline lane
    of the measured host time (None when nothing was computed)."""

    outs: tuple
    modelled_s: float | None = None
    start: float = 0.0
    end: float = 0.0
    measured_lane: str | None = "device"


class Device:
    """Base class of every device; subclasses set the class attributes and implement ``run``."""

    kind: ClassVar[str] = ""
    forms: ClassVar[tuple[str, ...]] = ()  # the accepted spellings, for error messages
    simulated: ClassVar[bool] = False  # kernel-program numerics and modelled device time
    static_shapes: ClassVar[bool] = False  # data-dependent shapes cannot run in a graph

    def __init__(self, name: str, exec_device: torch.device):
        self.name = name
        self.exec_device = exec_device
        self.sim_mode = "functional"

    @classmethod
    def parse(cls, spec: str) -> Device | None:
        """This kind's device for ``spec`` (lower-cased), None if ``spec`` is another kind's;
        ``ValueError`` when the spelling is this kind's but the device does not exist here."""
        return cls(spec, torch.device("cpu")) if spec == cls.kind else None

    @classmethod
    def available(cls) -> list[str]:
        """The names of this kind's devices that exist on this host."""
        return [cls.kind]

    def attach(self, previous: Device | None) -> Device:
        """Become the process's device (taking what it holds, e.g. a board lock); returns the device
        to use, which may be ``previous`` when it already satisfies this request. Releases
        ``previous`` otherwise; a failure leaves ``previous`` attached."""
        if previous is not None:
            previous.detach()
        return self

    def detach(self) -> None:
        """Release what ``attach`` took."""

    def needs_graph(self, exe: Executable) -> bool:
        """Whether ``run`` walks the FX graph (a disk-cache load then decodes it up front)."""
        return False

    def check_memory(self, exe: Executable) -> None:
        """Raise ``DeviceOutOfMemoryError`` when ``exe`` cannot fit next to the live buffers."""

    def check_upload(self, nbytes: int, shape: tuple, dtype: torch.dtype) -> None:
        """Raise ``DeviceOutOfMemoryError`` when a host copy of ``nbytes`` (a ``shape`` ``dtype`` tensor)
        cannot fit next to the live buffers."""

    def models_only(self) -> bool:
        """Whether a job computes nothing and only takes modelled time (a simulator in performance mode):
        the executor then calls ``schedule`` on the submitting thread instead of ``run`` on the worker."""
        return False

    def computes_on_host(self) -> bool:
        """Whether ``run`` computes on the host's own cores and returns when done (pfvm on the CPU): a
        job then runs on the submitting thread instead of the worker (``MNCORE_CPU_THREAD``)."""
        return False

    def schedule(self, exe: Executable, leaves: list, submitted: float) -> RunResult:
        """For ``models_only`` devices: the job's outputs (uninitialised, exactly the shapes and dtypes of
        ``exe.output_metas``) and its modelled start and end."""
        raise NotImplementedError

    def run(self, exe: Executable, leaves: list, args: list, submitted: float) -> RunResult:
        """Execute ``exe`` on ``args`` (buffers on ``exec_device`` and lifted scalars), on the worker."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
