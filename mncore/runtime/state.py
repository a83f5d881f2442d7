"""Process-wide runtime settings chosen by ``mncore.init``."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

IMPLICIT_SYNC_MODES = ("error", "warn", "silent")
EXECUTION_MODES = ("sync", "async_naive", "async")
SIM_MODES = ("functional", "performance")


@dataclass
class Settings:
    device: str | None = None
    exec_device: torch.device = torch.device("cpu")
    implicit_sync: str = "warn"
    execution: str = "async"
    debug: frozenset = frozenset()
    kind: str = "pfvm"  # 'pfvm' | 'emu2' | 'mncore2'
    float_dtype: str = "float"
    sim_mode: str = "functional"

    @property
    def simulated(self) -> bool:
        """emu2 and mncore2 run the kernel program with the precision policy's number formats."""
        return self.kind in ("emu2", "mncore2")

    @property
    def static_shapes(self) -> bool:
        return self.simulated


settings = Settings()


def debug_flags() -> frozenset:
    """``MNCORE_DEBUG`` is a comma-separated list (e.g. ``recompile``)."""
    return frozenset(f.strip() for f in os.environ.get("MNCORE_DEBUG", "").split(",") if f.strip())


def require_init() -> None:
    if settings.device is None:
        raise RuntimeError(
            "mncore is not initialized: call mncore.init(device=...) (or init_cpu()/init_cuda()) "
            "before putting tensors on the 'mncore' device"
        )
