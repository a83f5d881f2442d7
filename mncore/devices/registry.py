"""Device strings: parsing, validation and the torch device each one executes on."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

VALID_FORMS = ("pfvm:cpu", "pfvm:cuda", "pfvm:cuda:N", "emu2", "mncore2:auto", "mncore2:N")


@dataclass(frozen=True)
class DeviceSpec:
    """A validated device string and the torch device its graphs execute on."""

    name: str
    exec_device: torch.device

    @property
    def kind(self) -> str:
        return self.name.split(":")[0]


def _valid_list() -> str:
    from mncore.devices.board import n_boards

    avail = ["pfvm:cpu"]
    if torch.cuda.is_available():
        avail += [f"pfvm:cuda:{i}" for i in range(torch.cuda.device_count())]
        avail.insert(1, "pfvm:cuda")
    avail += ["emu2", "mncore2:auto"] + [f"mncore2:{i}" for i in range(n_boards())]
    return ", ".join(avail)


def parse(spec: str) -> DeviceSpec:
    """Validate ``spec``; unknown or unavailable devices raise ``ValueError`` listing valid ones."""
    if not isinstance(spec, str):
        raise TypeError(f"device must be a string such as 'pfvm:cpu', got {type(spec).__name__}")
    s = spec.strip().lower()
    if s == "pfvm:cpu":
        return DeviceSpec("pfvm:cpu", torch.device("cpu"))
    m = re.fullmatch(r"pfvm:cuda(?::(\d+))?", s)
    if m:
        index = int(m.group(1) or 0)
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {spec!r} needs a CUDA GPU, but torch.cuda.is_available() is False on this machine; "
                f"available devices: {_valid_list()}"
            )
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"available devices: {_valid_list()}"
            )
        return DeviceSpec(f"pfvm:cuda:{index}", torch.device("cuda", index))
    if s == "emu2":
        return DeviceSpec("emu2", torch.device("cpu"))
    m = re.fullmatch(r"mncore2:(auto|\d+)", s)
    if m:
        from mncore.devices.board import n_boards

        if m.group(1) != "auto" and int(m.group(1)) >= n_boards():
            raise ValueError(f"device {spec!r}: this host has {n_boards()} simulated board(s) (MNCORE_SIM_BOARDS); "
                             f"available devices: {_valid_list()}")
        return DeviceSpec(s, torch.device("cpu"))
    raise ValueError(
        f"unknown device {spec!r}; valid forms are {', '.join(VALID_FORMS)} "
        f"(available now: {_valid_list()})"
    )
