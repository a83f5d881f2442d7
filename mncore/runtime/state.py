"""Process-wide runtime settings chosen by ``mncore.init``."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

IMPLICIT_SYNC_MODES = ("error", "warn", "silent")
EXECUTION_MODES = ("sync", "async_naive", "async")


@dataclass
class Settings:
    device: str | None = None
    exec_device: torch.device = torch.device("cpu")
    implicit_sync: str = "warn"
    execution: str = "async"
    debug: frozenset = frozenset()


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
