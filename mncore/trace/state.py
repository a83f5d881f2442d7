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
    uploaded, random seeds drawn, pending values read on the host (guards), and every reason the
    step cannot be replayed without Python."""

    __slots__ = ("uploads", "seeds", "guards", "problems", "synced")

    def __init__(self) -> None:
        self.uploads: list[tuple] = []  # (leaf, host tensor, its version when read, site)
        self.seeds: list[Seed] = []
        self.guards: list = []  # trace.guards.Guard, in the order read
        self.problems: list[tuple[str, Site | None]] = []
        self.synced = False  # the step called sync(), which was left to the end of the step

    def refuse(self, cause: str) -> None:
        self.problems.append((cause, user_site()))


class WeakList:
    """Objects held weakly, in the order added: the pending graph roots, the cached traced values of
    views.

    A list of weak references, appended on every traced op and de-duplicated only when read: a
    ``WeakSet`` costs a Python-level ``add`` per op and a removal callback for every intermediate
    that dies. Dead references are compacted away whenever the list doubles, so a long stretch of
    tracing without a graph cut stays bounded by the live objects.
    """

    __slots__ = ("_refs", "_limit")

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self._limit = _MIN_COMPACT

    def add(self, obj: Any) -> None:
        refs = self._refs
        refs.append(weakref.ref(obj))
        if len(refs) > self._limit:
            live = self.live()
            self._refs = [weakref.ref(o) for o in live]
            self._limit = max(_MIN_COMPACT, 2 * len(live))

    def __bool__(self) -> bool:
        """Whether any object added is still alive (without building the list ``live`` returns)."""
        return any(r() is not None for r in self._refs)

    def live(self) -> list:
        """The live objects, each once, in the order they were first added."""
        seen: set[int] = set()
        out = []
        for r in self._refs:
            o = r()
            if o is not None and id(o) not in seen:
                seen.add(id(o))
                out.append(o)
        return out


_MIN_COMPACT = 4096


class Tracer:
    """Pending storages (graph roots) since the last cut, the cut counter, interned op signatures.

    ``lock`` makes each traced op and each graph cut atomic, so that several threads may trace
    (each op is recorded whole, and a cut never sees half a submission). It is re-entrant (an op
    may cut the graph for a host read) and never held while user code runs: autograd's engine
    thread traces backward while the thread that called ``backward()`` waits.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pending = WeakList()  # storages written since the last cut: the next graph's roots
        self.epoch = 0  # bumped at every graph cut: cached view values of older epochs are stale
        self.view_cached = WeakList()  # the ``ViewCache``s tensors hold, with traced values of this epoch
        self.sig_cache: dict[tuple, OpSig] = {}
        self.record_frames = False
        self.capture: list | None = None  # Context API tracing: host tensors read become constants
        self.host_read: Callable[[Any, str], Any] | None = None  # Context API tracing: evaluates (and guards) a read
        self.recording: Recording | None = None  # set while mncore.capture records a step

    def new_epoch(self) -> None:
        """Start a new graph epoch: cached view values are stale, and are dropped now rather than
        when the tensor is next read; a live ``.grad`` that is a view would otherwise keep the whole
        previous graph alive, its old device buffers included, until the next backward."""
        self.epoch += 1
        for cached in self.view_cached.live():
            cached.token = cached.ref = None
        self.view_cached = WeakList()


tracer = Tracer()


@contextlib.contextmanager
def separate_trace(host_read: Callable[[Any, str], Any] | None = None) -> Iterator[list[str]]:
    """Trace in a scope of its own (the Context API's compile): what is pending outside stays
    pending and out of this graph; yields the list that collects the host tensors read.
    ``host_read(tensor, reason)`` answers host reads of traced values (None: they raise)."""
    saved_pending = tracer.pending
    tracer.pending = WeakList()
    tracer.capture = []
    tracer.host_read = host_read
    try:
        yield tracer.capture
    finally:
        tracer.capture = None
        tracer.host_read = None
        tracer.pending = saved_pending
        tracer.new_epoch()
