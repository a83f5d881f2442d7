"""Errors raised while autograd runs backward on mncore tensors.

PyTorch's autograd engine restores the device's stream on its way out of a failing backward node;
for a Python device that calls back into Python while the Python error is still pending, and the
process aborts (``terminate called without an active exception``). So mncore never lets a Python
exception leave its kernels during backward: it returns this object instead, which PyTorch refuses
to take as a tensor with a C++ error (no Python error pending), and ``backward()`` raises a
``RuntimeError`` in the caller's thread whose message is this object's text: the op and the error.
A caller that can do better than that text (the Context API, whose users tell a step that cannot be
compiled from one that fails) takes the op's own exception back with :func:`take_failure`.
"""
from __future__ import annotations

from typing import Any

import torch


def in_backward() -> bool:
    """Whether the autograd engine is running a backward graph on this thread."""
    return torch._C._current_graph_task_id() != -1


_latest: list[BackwardFailure | None] = [None]  # until a caller takes it (one, so that nothing piles up)


def forget_frames(exc: BaseException | None) -> None:
    """Drop the tracebacks of ``exc`` and the exceptions chained to it: their frames pin the tensors of the
    failed trace (autograd graphs, device buffers) for as long as the exception is kept."""
    while exc is not None:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def take_failure(err: BaseException) -> BaseException | None:
    """The op's own exception if ``err`` is autograd's ``RuntimeError`` for the latest :class:`BackwardFailure`
    (which is then forgotten); None for any other error."""
    failure, _latest[0] = _latest[0], None
    return failure.exc if failure is not None and str(failure) in str(err) else None


class BackwardFailure:
    """Stands in for the result of an op that raised during backward; its text is the error."""

    def __init__(self, op: Any, exc: Exception):
        self.op, self.exc = op, exc
        forget_frames(exc)
        _latest[0] = self

    def __str__(self) -> str:
        return (f"<mncore: {self.op} failed during backward with {type(self.exc).__name__}: {self.exc}> "
                "(mncore reports errors in backward this way because PyTorch aborts the process when a "
                "Python device raises there)")

    __repr__ = __str__
