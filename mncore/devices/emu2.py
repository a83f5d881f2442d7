"""``emu2``: MN-Core 2 numerics on the host, kernel by kernel, with the modelled device time.

The executable's kernel program runs in order; the precision policy's number formats are
applied where the device would round (``compile.precision``), so the numerics show what
``mixed`` and ``half`` do. Device time comes from the cost model: an in-order device queue where
a job starts at max(submitted, previous job's end) and runs for its modelled time.
``functional`` mode computes values and records the modelled time without waiting for it;
``performance`` mode skips the numerics (outputs are left uninitialised) and only schedules each job
in the modelled queue: the executor runs it on the submitting thread, and a reader of its outputs is
held until its modelled end, so that host tracing and device execution overlap as on the board.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.fx as fx

from mncore.compile.executable import Executable
from mncore.compile.precision import half_operands, round_to_format, storage_bytes
from mncore.devices.base import Device, KernelFailed, RunResult
from mncore.devices.timing import hold_until
from mncore.errors import DeviceOutOfMemoryError
from mncore.ir import buffers
from mncore.sim.cost import cost_model
from mncore.sim.hardware import hardware


def _to_double(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return x.double()
    if x is torch.float32:
        return torch.float64
    return x


def _half_operand(x: Any) -> Any:
    return round_to_format(x, "half") if isinstance(x, torch.Tensor) else x


def run_kernels(exe: Executable, args: list) -> tuple:
    """Emulate the device: kernels in order, number formats applied at kernel boundaries."""
    graph = exe.graph
    policy = exe.policy
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for p, a in zip(placeholders, args):
        if policy == "double":
            a = _to_double(a)
        elif policy == "half" and isinstance(a, torch.Tensor):
            a = round_to_format(a, "half")
        env[p] = a
    remaining = {n: len(n.users) for n in graph.nodes}
    load = env.__getitem__
    for k in exe.kernels:
        for node in k.nodes:
            args_ = fx.node.map_arg(node.args, load)
            kwargs = fx.node.map_arg(node.kwargs, load)
            if policy == "double":
                args_ = fx.node.map_aggregate(args_, _to_double)
                kwargs = fx.node.map_aggregate(kwargs, _to_double)
            elif node.meta.get("mn_class") == "complex" and (policy in ("mixed", "half") or half_operands(node)):
                args_ = fx.node.map_aggregate(args_, _half_operand)
            try:
                env[node] = node.target(*args_, **kwargs)
            except Exception as e:  # noqa: BLE001 - named by the executor
                raise KernelFailed(node, k.index, e) from e
            for a in node.all_input_nodes:
                remaining[a] -= 1
                if remaining[a] == 0 and a.op != "placeholder":
                    env.pop(a, None)
        if policy == "half":
            for o in k.outputs:
                if isinstance(env.get(o), torch.Tensor):
                    env[o] = round_to_format(env[o], "half")
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    # under 'double' results stay float64 on the device; host reads return the program's dtype
    return tuple(fx.node.map_arg(out_node.args[0], load))


class DeviceQueue:
    """The modelled board's in-order job queue: a job starts when it was submitted and the previous
    job has finished on the device, and runs for its modelled time. Host-side runtime work (the
    worker preparing the next job) overlaps with the device's busy time, as on real hardware."""

    def __init__(self) -> None:
        self.free_at = 0.0

    def schedule(self, submitted: float, modelled: float) -> tuple[float, float]:
        start = max(submitted, self.free_at)
        self.free_at = start + modelled
        return start, self.free_at


class Emu2Device(Device):
    kind = "emu2"
    forms = ("emu2",)
    simulated = True
    static_shapes = True

    def __init__(self, name: str, exec_device: torch.device):
        super().__init__(name, exec_device)
        self.queue = DeviceQueue()
        self._placeholders: weakref.WeakKeyDictionary[Executable, tuple] = weakref.WeakKeyDictionary()

    def needs_graph(self, exe: Executable) -> bool:
        return self.sim_mode == "functional"

    def check_memory(self, exe: Executable) -> None:
        """Raise when the plan's peak exceeds DRAM minus what other live device tensors hold.

        Checked on every graph cut (a cached graph can stop fitting when other tensors grow);
        the buffer table keeps a running byte total, so this costs O(1).
        """
        capacity = hardware().dram_bytes
        resident = max(buffers.live_bytes() - exe.stats.get("input_host_bytes", 0), 0)
        free = max(capacity - resident, 0)
        need = exe.plan.peak_bytes
        if need > free:
            raise DeviceOutOfMemoryError(
                f"mncore: graph {exe.name} needs {need:,} bytes of device DRAM (peak of its memory plan) but "
                f"{self.name} has {free:,} bytes free ({capacity:,} total, {resident:,} held by other live "
                f"tensors); reduce the batch size or free tensors (MNCORE_SIM_DRAM_BYTES sets the board size)")

    def check_upload(self, nbytes: int, shape: tuple, dtype: torch.dtype) -> None:
        capacity = hardware().dram_bytes
        resident = buffers.live_bytes()
        if resident + nbytes > capacity:
            raise DeviceOutOfMemoryError(
                f"mncore: copying a {tuple(shape)} {dtype} tensor ({nbytes:,} bytes) to {self.name} needs more device DRAM than is free "
                f"({max(capacity - resident, 0):,} of {capacity:,} bytes; {resident:,} held by live tensors); "
                f"free tensors or use a smaller one (MNCORE_SIM_DRAM_BYTES sets the board size)")

    @staticmethod
    def upload_bytes(leaves: list, policy: str) -> int:
        """Bytes of inputs that reach the board for the first time (host data, new parameters)."""
        n = 0
        for leaf in leaves:
            if not leaf.on_board:
                leaf.on_board = True
                if leaf.graph is None:
                    n += storage_bytes(leaf.meta, policy)
        return n

    def models_only(self) -> bool:
        return self.sim_mode == "performance"

    def _place(self, exe: Executable, leaves: list, submitted: float) -> tuple[float, float, float]:
        """The job's modelled time (its graph and the uploads it makes) and its (start, end) in the queue."""
        modelled = exe.modelled_s + cost_model().transfer(self.upload_bytes(leaves, exe.policy))
        return (modelled, *self.queue.schedule(submitted, modelled))

    def schedule(self, exe: Executable, leaves: list, submitted: float) -> RunResult:
        """Performance mode: the job's place in the board's queue and uninitialised outputs; every run of a
        graph returns the same buffers (memory accounting still counts each output once)."""
        modelled, start, end = self._place(exe, leaves, submitted)
        outs = self._placeholders.get(exe)
        if outs is None:
            outs = self._placeholders[exe] = tuple(
                torch.empty_strided(m.shape, m.stride, dtype=m.dtype) for m in exe.output_metas)
        return RunResult(outs, modelled, start, end, measured_lane=None)

    def run(self, exe: Executable, leaves: list, args: list, submitted: float) -> RunResult:
        if self.sim_mode == "performance":  # on the worker only when a job was already queued there
            result = self.schedule(exe, leaves, submitted)
            hold_until(result.end)
            return result
        modelled, start, end = self._place(exe, leaves, submitted)
        return RunResult(run_kernels(exe, args), modelled, start, end, measured_lane="emulator")
