"""SIGINT and SIGTERM as an exception, so that a run that is stopped still kills its children
(``CellRunner.run``'s ``finally``) and finalizes the results of the cells that finished."""
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


def _raise(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


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


def signals_raise() -> contextlib.AbstractContextManager[None]:
    """Within the block SIGINT and SIGTERM raise ``Interrupted`` (main thread only); the previous handlers
    come back after."""
    return _handling(_raise)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside ``signals_raise``: a SIGINT or SIGTERM that arrives within the block is raised when the block
    ends, so that what the block writes is written whole (a result line together with its counters)."""
    got: list[int] = []
    with _handling(lambda signum, _frame: got.append(signum)):
        yield
    if got:
        raise Interrupted(got[0])
