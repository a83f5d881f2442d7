"""The tracer's process-wide state (not thread-local: autograd runs backward on its own thread)."""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterator

from mncore.ir.values import OpSig, Seed, Site
from mncore.trace.sites import user_site


class Recording:
    """What a step capture (``mncore.capture``) must see while its step traces: host tensors
    uploaded, random seeds drawn, and every reason the step cannot be replayed without Python."""

    __slots__ = ("uploads", "seeds", "problems", "synced")

    def __init__(self) -> None:
        self.uploads: list[tuple] = []  # (leaf, host tensor, its version when read, site)
        self.seeds: list[Seed] = []
        self.problems: list[tuple[str, Site | None]] = []
        self.synced = False  # the step called sync(), which was left to the end of the step

    def refuse(self, cause: str) -> None:
        self.problems.append((cause, user_site()))


class Tracer:
    """Pending storages (graph roots) since the last cut, the cut counter, interned op signatures.

    ``lock`` makes each traced op and each graph cut atomic, so that several threads may trace
    (each op is recorded whole, and a cut never sees half a submission). It is re-entrant (an op
    may cut the graph for a host read) and never held while user code runs: autograd's engine
    thread traces backward while the thread that called ``backward()`` waits.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending: weakref.WeakSet = weakref.WeakSet()
        self.epoch = 0  # bumped at every graph cut: cached view values of older epochs are stale
        self.sig_cache: dict[tuple, OpSig] = {}
        self.record_frames = False
        self.capture: list | None = None  # Context API tracing: host tensors read become constants
        self.host_read: Callable[[Any, str], Any] | None = None  # Context API tracing: evaluates (and guards) a read
        self.freeze_at_reuse = False  # MNCORE_GC_FREEZE: freeze again once a step repeats (see sync)
        self.recording: Recording | None = None  # set while mncore.capture records a step


tracer = Tracer()


@contextlib.contextmanager
def separate_trace(host_read: Callable[[Any, str], Any] | None = None) -> Iterator[list[str]]:
    """Trace in a scope of its own (the Context API's compile): what is pending outside stays
    pending and out of this graph; yields the list that collects the host tensors read.
    ``host_read(tensor, reason)`` answers host reads of traced values (None: they raise)."""
    saved_pending = tracer.pending
    tracer.pending = weakref.WeakSet()
    tracer.capture = []
    tracer.host_read = host_read
    try:
        yield tracer.capture
    finally:
        tracer.capture = None
        tracer.host_read = None
        tracer.pending = saved_pending
        tracer.epoch += 1
