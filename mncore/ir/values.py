"""Graph values: cheap Python objects recorded per aten op, turned into torch.fx only on compile.

A value is a pair ``(producer, index)``; the producer is a :class:`Node` (pending op),
a :class:`Data` leaf (a device buffer) or a :class:`Scalar` leaf (a lifted Python number).
A node carries its :class:`OpSig` (the interned signature: op, non-tensor arguments, input
metadata, and the inferred output metadata), so later stages need nothing from the tracer.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any

from mncore.ir import buffers
from mncore.ir.latch import Latch
from mncore.ir.meta import TensorMeta

_seq = itertools.count()


class OpSig:
    """One interned op signature: ``id`` numbers it in graph keys; ``key`` is what was interned."""

    __slots__ = ("id", "key", "struct", "metas", "site", "nout")

    def __init__(self, id: int, key: tuple, struct: Any, metas: tuple[TensorMeta | None, ...],
                 site: Site | None = None):
        self.id = id
        self.key = key  # (target, tensor-free args, kwargs, input metas)
        self.struct = struct  # None: one tensor; 'none': no output; else the container type
        self.metas = metas
        self.site = site  # where in the user's program it was first traced (errors name it)
        self.nout = 0 if struct is None else len(metas)  # outputs a node indexes (0: a single tensor)


Site = tuple[str, int, str]  # (file, line, function) in the user's program


def describe_site(site: Site | None) -> str:
    """``file:line in function``, the one spelling of a source site in messages."""
    return f"{site[0]}:{site[1]} in {site[2]}" if site else "<no Python frame: autograd engine thread>"


class Node:
    """One traced op. ``template`` holds the non-tensor arguments with markers for tensors."""

    __slots__ = ("target", "template", "inputs", "sig", "seq", "nout", "frame", "visit", "local")

    def __init__(self, target: Any, template: Any, inputs: tuple, sig: OpSig, frame: Any = None):
        self.target = target
        self.template = template
        self.inputs = inputs  # tuple of values (producer, index)
        self.sig = sig
        self.seq = next(_seq)
        self.nout = sig.nout
        self.frame = frame
        self.visit = -1  # graph collection's marks (``graph.collect``): its pass number and the node's
        self.local = -1  # position in that graph; attributes, not id-keyed sets, on the cut's hot path

    @property
    def metas(self) -> tuple[TensorMeta | None, ...]:
        return self.sig.metas


class Data:
    """A leaf that owns one buffer-table entry; the entry is freed when the leaf dies.

    A leaf produced by a submitted job is a placeholder until the worker fills it; ``ready``
    is set then (or ``error`` is stored), so host reads wait only for the graph they need.
    ``fallback`` is the value the leaf replaces (an in-place update's previous value): if the
    job fails, readers get that value instead of the error; the worker drops it on success.
    The storages that took this value are kept weakly (:meth:`holders`): a captured step binds a
    leaf it read to whatever holds it at replay, not to the buffer it read once.
    """

    __slots__ = ("bid", "meta", "ready", "error", "graph", "on_board", "fallback", "_owners", "__weakref__")

    def __init__(self, meta: TensorMeta, tensor: Any = None, ready: Latch | None = None):
        self.bid = next(buffers.ids)
        self.meta = meta
        self.error: BaseException | None = None
        self.graph: str | None = None
        self.on_board = False  # simulated devices: whether its host->device copy was already modelled
        self.fallback: Data | None = None
        self._owners: Any = None  # None, one weak reference (nearly always), or a tuple of them
        if tensor is not None:
            buffers.put(self.bid, tensor)
            self.ready = None
        else:
            self.ready = ready or Latch()  # the outputs of one job share their job's latch

    def own(self, storage: Any) -> None:
        """``storage`` now holds this value (kept weakly). One owner is kept without a tuple around it:
        a replayed step writes hundreds of values, and each tuple is one more object for the collector."""
        ref = weakref.ref(storage)
        owners = self._owners
        self._owners = ref if owners is None else (owners, ref) if type(owners) is weakref.ref else owners + (ref,)

    def holders(self) -> tuple:
        """Weak references to the storages that took this value, oldest first."""
        owners = self._owners
        return () if owners is None else (owners,) if type(owners) is weakref.ref else owners

    def wait(self, for_user: bool = True) -> Any:
        """Block until the buffer exists, then return it (re-raising a worker error, unless the
        leaf has a value to fall back to). An error raised ``for_user`` is marked seen: the report at exit
        must not say that nothing read it."""
        if self.ready is not None:
            self.ready.wait()
        if self.error is not None:
            if self.fallback is not None:
                return self.fallback.wait(for_user)
            if for_user:
                self.error.seen = True
            raise self.error
        return buffers.get(self.bid)

    def failure(self) -> BaseException | None:
        """The error :meth:`wait` would raise, known now without waiting (None: a value, or not yet known):
        its graph's error, unless a value it replaces stands in for it."""
        leaf = self
        while leaf.error is not None:
            if leaf.fallback is None:
                return leaf.error
            leaf = leaf.fallback
        return None

    def __del__(self) -> None:
        try:
            buffers.free(self.bid)
        except Exception:  # interpreter shutdown
            pass


class Scalar:
    """A Python number lifted out of the graph key so that changing it never recompiles."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class Seed(Scalar):
    """A random op's seed: a lifted scalar that must be fresh on every execution."""

    __slots__ = ()


class TensorMarker:
    """Stands for a tensor argument inside a node template."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "T"


class ScalarMarker:
    """Stands for a lifted scalar inside a node template; keeps the scalar's Python type."""

    __slots__ = ("kind",)

    def __init__(self, kind: type):
        self.kind = kind

    def __repr__(self) -> str:
        return f"S[{self.kind.__name__}]"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScalarMarker) and other.kind is self.kind

    def __hash__(self) -> int:
        return hash(self.kind)


class DeviceToken:
    """Stands for ``device='mncore'`` in templates; the FX build lowers it to the execution device."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEV"


T = TensorMarker()
DEV = DeviceToken()
SCALAR_MARKERS = {float: ScalarMarker(float), int: ScalarMarker(int), bool: ScalarMarker(bool),
                  complex: ScalarMarker(complex)}
