"""Lowerings that take the worker down: ``aten.neg.default`` exits the process (a crash),
``aten.relu.default`` never returns (a hang). The fuzzer must record both and carry on."""
from __future__ import annotations

import os
import time

import torch

from mncore import register_lowering


def _crash(*args: object, **kwargs: object) -> torch.Tensor:
    os._exit(3)


def _hang(*args: object, **kwargs: object) -> torch.Tensor:
    time.sleep(3600)
    raise AssertionError("unreachable")


register_lowering(torch.ops.aten.neg.default, _crash)
register_lowering(torch.ops.aten.relu.default, _hang)
