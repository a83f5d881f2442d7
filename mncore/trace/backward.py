"""Errors raised while autograd runs backward on mncore tensors.

PyTorch's autograd engine restores the device's stream on its way out of a failing backward node;
for a Python device that calls back into Python while the Python error is still pending, and the
process aborts (``terminate called without an active exception``). So mncore never lets a Python
exception leave its kernels during backward: it returns this object instead, which PyTorch refuses
to take as a tensor with a C++ error (no Python error pending), and ``backward()`` raises a
``RuntimeError`` in the caller's thread whose message is this object's text: the op and the error.
"""
from __future__ import annotations

from typing import Any

import torch


def in_backward() -> bool:
    """Whether the autograd engine is running a backward graph on this thread."""
    return torch._C._current_graph_task_id() != -1


class BackwardFailure:
    """Stands in for the result of an op that raised during backward; its text is the error."""

    def __init__(self, op: Any, exc: Exception):
        self.op, self.exc = op, exc

    def __str__(self) -> str:
        return (f"<mncore: {self.op} failed during backward with {type(self.exc).__name__}: {self.exc}> "
                "(mncore reports errors in backward this way because PyTorch aborts the process when a "
                "Python device raises there)")

    __repr__ = __str__
