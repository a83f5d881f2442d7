"""Load the board description (``hardware.json``): public figures, each with source and trust level."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mncore import config

HARDWARE_JSON = Path(__file__).with_name("hardware.json")
_HARDWARE_FILE = str(HARDWARE_JSON)  # asked for several times per simulated job: not converted each time


@dataclass(frozen=True)
class Hardware:
    """The figures the compiler and cost model read; ``raw`` keeps sources and trust levels."""

    clock_hz: float
    peak_flops: dict[str, float]
    vector_flops: dict[str, float]
    dram_bytes: int
    dram_groups: int
    dram_bw: float
    host_link_bw: float
    formats: dict[str, dict[str, Any]]
    raw: dict[str, Any]

    @property
    def mabs(self) -> int:
        h = self.raw["hierarchy"]["value"]
        return h["groups"] * h["l2b_per_group"] * h["l1b_per_l2b"] * h["mab_per_l1b"]

    @property
    def pes(self) -> int:
        return self.mabs * self.raw["hierarchy"]["value"]["pe_per_mab"]


@functools.lru_cache(maxsize=None)
def _load(path: str, dram_bytes: int | None) -> Hardware:
    raw = json.loads(Path(path).read_text())
    v = {k: e["value"] for k, e in raw.items() if isinstance(e, dict) and "value" in e}
    return Hardware(
        clock_hz=float(v["clock_hz"]), peak_flops=dict(v["peak_flops"]), vector_flops=dict(v["vector_flops"]),
        dram_bytes=dram_bytes or int(v["dram_bytes"]), dram_groups=int(v["dram_groups"]),
        dram_bw=float(v["dram_bw_per_group"]) * int(v["dram_groups"]), host_link_bw=float(v["host_link_bw"]),
        formats=dict(v["number_formats"]), raw=raw,
    )


def hardware() -> Hardware:
    """The board description; ``MNCORE_SIM_DRAM_BYTES`` overrides the DRAM size (read on each call)."""
    return _load(_HARDWARE_FILE, config.get("sim_dram_bytes"))
