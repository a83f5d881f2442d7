"""``mncore2:auto`` / ``mncore2:N``: a simulated MN-Core 2 board (emu2's numerics and cost model,
16 GiB of DRAM, and an exclusive per-board lock held from ``init`` until the process switches
device or exits)."""
from __future__ import annotations

import re

import torch

from mncore import config
from mncore.devices import board as boards
from mncore.devices.base import Device
from mncore.devices.emu2 import Emu2Device


class MNCore2Device(Emu2Device):
    kind = "mncore2"
    forms = ("mncore2:auto", "mncore2:N")

    def __init__(self, name: str, exec_device: torch.device):
        super().__init__(name, exec_device)
        self.board: boards.Board | None = None

    @classmethod
    def parse(cls, spec: str) -> Device | None:
        m = re.fullmatch(r"mncore2:(auto|\d+)", spec)
        if m is None:
            return None
        n = config.get("sim_boards")
        if m.group(1) != "auto" and int(m.group(1)) >= n:
            raise ValueError(f"device {spec!r}: this host has {n} simulated board(s) (MNCORE_SIM_BOARDS)")
        return cls(spec, torch.device("cpu"))

    @classmethod
    def available(cls) -> list[str]:
        return ["mncore2:auto"] + [f"mncore2:{i}" for i in range(config.get("sim_boards"))]

    def attach(self, previous: Device | None) -> Device:
        which = self.name.split(":", 1)[1]
        if isinstance(previous, MNCore2Device) and previous.board is not None and (
                which == "auto" or int(which) == previous.board.index):
            return previous  # 'auto' is satisfied by the board this process holds
        board = boards.acquire(which)  # a failure here leaves the previous device attached
        if previous is not None:
            previous.detach()
        self.board = board
        self.name = board.name
        return self

    def detach(self) -> None:
        if self.board is not None:
            self.board.release()
            self.board = None
