"""SIGINT and SIGTERM as an exception, so that a run that is stopped still kills its children
(``CellRunner.run``'s ``finally``) and finalizes the results of the cells that finished.

A handler that fires while Python runs a garbage-collection callback, a ``__del__`` or a weakref finalizer
raises where Python only prints "Exception ignored in ..." and goes on, so the exception alone can be lost
(a campaign stopped by SIGTERM then ran to its time budget). The handler therefore also records the signal,
and the loops that wait call ``check()`` at each turn to raise it there."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by ``signum``; ``exit_code`` is the shell's convention (128 + signal)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


_received: list[int] = []  # signals whose Interrupted was raised inside the outermost ``signals_raise`` block


def _raise(signum: int, _frame: Any) -> None:
    _received.append(signum)
    raise Interrupted(signum)


def check() -> None:
    """Raise ``Interrupted`` for a signal received within ``signals_raise`` whose exception may have been
    swallowed (see the module's docstring); a no-op otherwise. Safe to call where an exception may propagate."""
    if _received:
        raise Interrupted(_received[0])


@contextlib.contextmanager
def _handling(handler: Any) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` within the block (main thread only: elsewhere Python cannot
    install handlers and the block runs unchanged); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise ``Interrupted`` (main thread only); the previous handlers
    come back after. The outermost block forgets its signals when it ends (they were raised, or it ended
    anyway)."""
    outermost = signal.getsignal(signal.SIGINT) is not _raise  # not nested (a campaign's block in the command's)
    try:
        with _handling(_raise):
            yield
    finally:
        if outermost:
            _received.clear()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside ``signals_raise``: a SIGINT or SIGTERM that arrives within the block is raised when the block
    ends, so that what the block writes is written whole (a result line together with its counters)."""
    got: list[int] = []
    with _handling(lambda signum, _frame: got.append(signum)):
        yield
    if got:
        raise Interrupted(got[0])
