"""The performance model: modelled device time of kernels, jobs and host<->device copies.

A kernel is either compute-bound or memory-bound: its time is the larger of FLOPs over the
achieved compute rate for its number format and class (matrix units for matmul/conv, vector
units otherwise) and bytes over the achieved DRAM bandwidth, plus a fixed per-kernel overhead.
The efficiencies and overheads live in ``costs.json`` (or the file ``MNCORE_SIM_COSTS`` names).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from mncore import config
from mncore.sim.hardware import Hardware, hardware

COSTS_JSON = Path(__file__).with_name("costs.json")
_COSTS_FILE = str(COSTS_JSON)  # asked for on every performance-mode job: not converted each time
MATRIX_KINDS = ("complex",)


@dataclass(frozen=True)
class KernelCost:
    seconds: float
    compute_s: float
    memory_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass(frozen=True)
class CostModel:
    hw: Hardware
    constants: dict[str, float]

    def kernel(self, kind: str, flops: float, nbytes: float, fmt: str) -> KernelCost:
        """Time of one fused kernel of class ``kind`` computing in number format ``fmt``."""
        c = self.constants
        if kind in MATRIX_KINDS:
            rate = self.hw.peak_flops[fmt] * c["matmul_efficiency"]
        else:
            rate = self.hw.vector_flops[fmt] * c["vector_efficiency"]
        compute = flops / rate
        memory = nbytes / (self.hw.dram_bw * c["dram_efficiency"])
        return KernelCost(max(compute, memory) + c["kernel_overhead_s"], compute, memory)

    def transfer(self, nbytes: float) -> float:
        """Host<->device copy time over the host link."""
        return nbytes / (self.hw.host_link_bw * self.constants["host_link_efficiency"])

    @property
    def launch_s(self) -> float:
        return self.constants["launch_overhead_s"]


@functools.lru_cache(maxsize=None)
def _constants(path: str) -> dict[str, float]:
    try:
        raw = json.loads(Path(path).read_text())
        return {k: float(e["value"]) for k, e in raw.items() if not k.startswith("_")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"cannot read the cost model constants from {path}: {e}") from None


def costs_path() -> str:
    """The constants file in force (``MNCORE_SIM_COSTS`` or the packaged ``costs.json``)."""
    return config.get("sim_costs") or _COSTS_FILE


def cost_model() -> CostModel:
    """The model for the current hardware description and constants file. Asked for on every
    performance-mode job, so the last one is kept while neither input changes."""
    path, hw = costs_path(), hardware()
    last = _last[0]
    if last is not None and last.hw is hw and last.path == path:
        return last.model
    consts = _constants(path)
    missing = {"matmul_efficiency", "vector_efficiency", "dram_efficiency", "host_link_efficiency",
               "kernel_overhead_s", "launch_overhead_s"} - set(consts)
    if missing:
        raise ValueError(f"cost model constants file {path} lacks {', '.join(sorted(missing))}")
    model = CostModel(hw, consts)
    _last[0] = _Built(path, hw, model)
    return model


@dataclass(frozen=True)
class _Built:
    path: str
    hw: Hardware
    model: CostModel


_last: list[_Built | None] = [None]
