"""``mncore.capture``: trace a repeating step twice, then replay its graph without running the function.

Each call is keyed on the structure of its arguments (shapes, dtypes, devices of tensors, values of
the rest), grad mode, autocast, and the state of the modules and optimizers the step uses (see
``world``). Per key: the first call traces and records; later calls trace again until two
recordings agree, and from then on calls replay. Every ``check_every``-th call traces again and
compares instead of replaying. What capture cannot replay (host reads inside the step, Python
numbers that change, host tensors changed inside it) keeps being traced, with one
:class:`~mncore.errors.CaptureWarning` naming the cause and the source line.
"""
from __future__ import annotations

import functools
import numbers
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from mncore import config
from mncore.capture.plan import Plan, disagreement, record
from mncore.capture.replay import GuardChanged, Unbound, replay
from mncore.capture.world import World
from mncore.config import require_init, settings
from mncore.devices import registry
from mncore.errors import CaptureError, CaptureWarning
from mncore.ir.values import describe_site
from mncore.observe import metrics
from mncore.trace.state import tracer
from mncore.trace.tensor import LazyTensor


_CHANGED_READS = 3  # replays in a row whose host reads changed before a key is refused


@dataclass(eq=False)
class _Entry:
    """One call key: its last recording, the plan it replays, and why it is refused (if it is)."""

    last: Plan | None = None
    ready: Plan | None = None
    calls: int = 0
    disagreements: int = 0
    changed_reads: int = 0  # replays in a row whose host reads changed (``GuardChanged``)
    refused: str | None = None


class Captured:
    """A captured step function; call it as the function itself. ``entries`` keeps ``max_entries`` keys."""

    def __init__(self, fn: Callable, check_every: int | None = None, strict: bool = False, max_entries: int = 8):
        if isinstance(fn, Captured):  # capture(captured): the same function, with these options
            fn = fn.fn
        if not callable(fn):
            raise TypeError(f"mncore.capture needs a function to capture, got {type(fn).__name__}")
        if max_entries < 1:
            raise ValueError(f"mncore.capture(max_entries={max_entries}): keep at least one entry")
        self.fn = fn
        self.check_every = config.get("capture_check") if check_every is None else int(check_every)
        if self.check_every < 0:
            raise ValueError(f"mncore.capture(check_every={check_every}): use 0 (never) or a positive number")
        self.strict = strict
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.world = World()
        self._warned: set[str] = set()
        self._evicted = 0
        self._check_next = False
        functools.update_wrapper(self, fn, updated=())  # the name and docs, not the function's attributes

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        """``@mncore.capture`` on a method: the instance is the first argument."""
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        require_init()
        if tracer.recording is not None:  # called by a step another capture records: part of that step
            return self.fn(*args, **kwargs)
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        roots = self.world.roots(self.fn, leaves)
        key = (registry.active(), settings.device, settings.float_dtype, spec, tuple([_arg_key(x) for x in leaves]),
               _aliases(leaves), roots, self.world.key())
        entry = self.entries.get(key)
        if entry is None:
            previous = next(reversed(self.entries), None)
            entry = self.entries[key] = _Entry()
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
                self._evicted += 1
                if self._evicted == self.max_entries:  # keys churn: say what keeps changing, once
                    self._refuse(entry, f"every call has a new key ({_key_change(previous, key)}), so none "
                                        "is seen twice")
            if len(self.entries) > 1:
                metrics.count_retrace("a new call key (argument shapes, values, modes or module state)")
        else:
            self.entries.move_to_end(key)
        entry.calls += 1
        due = (self.check_every > 0 and entry.calls % self.check_every == 0) or self._check_next
        self._check_next = False
        if entry.refused is not None:
            if not due:
                return self.fn(*args, **kwargs)
            entry.refused, entry.disagreements = None, 0  # try again now and then: the cause may be gone
        if entry.ready is not None:
            why = "a periodic re-validation (check_every)" if due else self._guard(entry.ready)
            changed = False
            if why is None:
                try:
                    out = replay(entry.ready, leaves)
                    entry.changed_reads = 0
                    return out
                except GuardChanged as e:
                    why, changed = str(e), True
                    entry.changed_reads += 1
                except Unbound as e:
                    why = str(e)
            metrics.count_retrace(why)
            if not due:
                entry.ready = entry.last = None
            if changed and entry.changed_reads >= _CHANGED_READS:  # each costs a replay and two recordings
                entry.changed_reads = 0
                out = self._record(entry, args, kwargs, leaves)  # (the step runs, strict mode or not)
                self._refuse(entry, f"{why} on {_CHANGED_READS} replays in a row; capture replays a step whose "
                                    "host reads keep their values (read such values after the call)")
                return out
        return self._record(entry, args, kwargs, leaves)

    def _guard(self, plan: Plan) -> str | None:
        if self.world.hyperparameters() != plan.hyperparameters:
            return "an optimizer hyperparameter (lr, momentum, ...) changed"
        return None

    def _record(self, entry: _Entry, args: tuple, kwargs: dict, leaves: list) -> Any:
        try:
            out, plan = record(self.fn, args, kwargs, leaves, self.world, entry.last)
        except BaseException:
            entry.last = entry.ready = None  # nothing half-captured: the next call records afresh
            raise
        metrics.add("captures")
        revalidating, entry.ready = entry.ready, None
        if plan.problem is not None:
            cause, site = plan.problem
            entry.last = None
            self._refuse(entry, cause + (f" (at {describe_site(site)})" if site else ""))
            return out
        why = None if entry.last is None else disagreement(entry.last, plan)
        if entry.last is not None and why is None:
            entry.ready, entry.disagreements = plan, 0
        elif why is not None:
            if not (revalidating is not None and why.read_changed):  # (new data, met by a re-validation)
                entry.disagreements += 1
            metrics.count_retrace(why.reason)
            # the first two recordings may differ for a good reason (state made on the first step, such
            # as optimizer buffers); a third that differs, or a re-validation that does, is refused
            # (a re-validation that meets a changed host read met new data: the next call records again)
            if why.final or (revalidating is not None and not why.read_changed) or entry.disagreements >= 2:
                self._refuse(entry, why.reason, why.detail)
        entry.last = plan
        return out

    def _refuse(self, entry: _Entry, cause: str, detail: str = "") -> None:
        """Stop replaying this key; warn once per cause (the values of this time in the message)."""
        entry.refused = cause
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        message = (f"mncore.capture({name}): not replaying this step: {cause}"
                   + (f" ({detail})" if detail else "")
                   + ". It keeps being traced every call (its values are right; it is only slower)")
        if cause in self._warned:
            return
        self._warned.add(cause)
        if self.strict:
            raise CaptureError(message)
        warnings.warn(message, CaptureWarning, stacklevel=4)  # the caller of the captured function

    def check_next(self) -> None:
        """Make the next call a re-validation, as every ``check_every``-th call is: it traces the step
        and compares the recording with the one it replays (a refusal warns why). For a test or a
        harness that wants to know a step stays replayable without waiting for the periodic check."""
        self._check_next = True

    def reset(self) -> None:
        """Forget every recording (the next call records afresh)."""
        self.entries.clear()


def _flatten(tree: Any, leaves: list) -> Any:
    """Append the leaves of ``tree`` to ``leaves`` in pytree's order; return its structure (to key on).

    Tuples, lists and dicts (what steps are called with) are walked here, several times faster than
    ``pytree.tree_flatten``; tensors and plain values are leaves; anything else (a namedtuple, a
    registered class) goes through torch's pytree, whose spec is then part of the structure."""
    t = type(tree)
    if t is tuple or t is list:
        return t, tuple([_flatten(x, leaves) for x in tree])
    if t is dict:
        return dict, tuple(tree), tuple([_flatten(x, leaves) for x in tree.values()])
    if isinstance(tree, torch.Tensor) or t in (int, float, bool, str) or tree is None:
        leaves.append(tree)
        return None
    sub, spec = pytree.tree_flatten(tree)
    leaves.extend(sub)
    return spec


def _arg_key(x: Any) -> tuple:
    """Tensors by their metadata (a view: also its base's identity, which the graph reads as a whole);
    numbers and strings by value (``repr``: -0.0 is not 0.0, NaN is NaN); other objects by identity."""
    if isinstance(x, LazyTensor):
        if x.mn_chain:
            return "view", x.mn_meta, x.mn_storage.meta, x.requires_grad, repr(x.mn_chain), id(x.mn_storage)
        return "lazy", x.mn_meta, x.requires_grad
    if isinstance(x, torch.Tensor):
        return "host", x.shape, x.stride(), x.dtype, x.device, x.requires_grad
    if isinstance(x, (str, numbers.Number)) or x is None:
        return type(x), repr(x)
    return "object", type(x), id(x)


_KEY_PARTS = ("the device", "the device", "the precision policy", "the structure of the arguments", None,
              "which arguments alias each other", "the modules, optimizers or tensors the step uses by name",
              "grad mode, autocast, a module's training flag or a parameter's requires_grad or .grad")


def _key_change(old: tuple | None, new: tuple) -> str:
    """What differs between two call keys, in words (for the warning when keys keep changing)."""
    if old is None:
        return "unknown change"
    for part, a, b in zip(_KEY_PARTS, old, new):
        if a == b:
            continue
        if part is not None:
            return f"{part} changed"
        i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        if b[i][0] == "object":
            return (f"argument {i} is a {b[i][1].__name__} object, keyed by identity, and a new one is passed "
                    "each call; pass its tensors in a dict, tuple or list, or register the class with "
                    "torch.utils._pytree")
        return f"argument {i} changed ({a[i]!r}, then {b[i]!r})"
    return "unknown change"


def _aliases(leaves: list) -> tuple[int, ...]:
    """For each argument, the first argument sharing its storage (or object): aliasing changes the graph."""
    first: dict[int, int] = {}
    out = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            out.append(first.setdefault(id(x.mn_storage) if isinstance(x, LazyTensor) else id(x), i))
        else:
            out.append(-1)
    return tuple(out)


def capture(fn: Callable | None = None, *, check_every: int | None = None, strict: bool = False,
            max_entries: int = 8) -> Any:
    """Capture a step function: ``step = mncore.capture(step)``, ``@mncore.capture`` or
    ``@mncore.capture(check_every=50, strict=True)``.

    ``check_every``: every N-th call traces and compares instead of replaying (default
    ``MNCORE_CAPTURE_CHECK``; 0: never). ``strict``: raise :class:`~mncore.errors.CaptureError`
    instead of warning when a step cannot be replayed. ``max_entries``: call keys kept.
    """
    if fn is None:
        return lambda f: Captured(f, check_every, strict, max_entries)
    return Captured(fn, check_every, strict, max_entries)
