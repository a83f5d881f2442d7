"""``pfvm:cpu`` and ``pfvm:cuda[:N]``: graphs run as their generated code with PyTorch kernels."""
from __future__ import annotations

import re

import torch

from mncore import config
from mncore.compile.executable import Executable
from mncore.devices.base import Device, RunResult


class PfvmDevice(Device):
    kind = "pfvm"
    forms = ("pfvm:cpu", "pfvm:cuda", "pfvm:cuda:N")

    @classmethod
    def parse(cls, spec: str) -> Device | None:
        if spec == "pfvm:cpu":
            return cls("pfvm:cpu", torch.device("cpu"))
        m = re.fullmatch(r"pfvm:cuda(?::(\d+))?", spec)
        if m is None:
            return None
        index = int(m.group(1) or 0)
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} needs a CUDA GPU, but torch.cuda.is_available() is False "
                             "on this machine")
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return cls(f"pfvm:cuda:{index}", torch.device("cuda", index))

    @classmethod
    def available(cls) -> list[str]:
        names = ["pfvm:cpu"]
        if torch.cuda.is_available():
            names += ["pfvm:cuda"] + [f"pfvm:cuda:{i}" for i in range(torch.cuda.device_count())]
        return names

    def computes_on_host(self) -> bool:
        return self.exec_device.type == "cpu"

    def run(self, exe: Executable, leaves: list, args: list, submitted: float) -> RunResult:
        outs = (exe.python_code() if config.get("reinplace") else exe.gm)(*args)
        if self.exec_device.type == "cuda":
            torch.cuda.synchronize(self.exec_device)
        return RunResult(outs)
