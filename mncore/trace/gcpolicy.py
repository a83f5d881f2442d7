"""Python's garbage collector around lazy steps: freeze what lives on, collect young objects at cuts.

A traced step allocates thousands of container objects (nodes, values, wrappers) that the autograd
graph keeps alive until backward; CPython's collector, triggered every 700 net allocations,
traverses them again and again inside the step and finds nothing (the tracer makes no reference
cycles). Two knobs change that, both on by default:

- ``MNCORE_GC_FREEZE``: ``init`` freezes what is alive, and the first graph a repeating step reuses
  triggers one full collection and freezes again (model, optimizer state, executables), so full
  collections never traverse them.
- ``MNCORE_GC_AT_SYNC``: from that same point on, the young generations are collected at graph cuts
  (and at the end of each replayed captured step), when the step's temporaries are already gone,
  instead of in the middle of forward and backward. The automatic threshold is raised to
  ``_CEILING`` net allocations, so code that stops syncing is still collected.
"""
from __future__ import annotations

import gc

from mncore import config

_CEILING = 100_000  # automatic young collections between cuts only past this many net allocations

_state = {"armed": False, "saved": None}  # saved: CPython's thresholds, while collecting at cuts


def at_init() -> None:
    """``mncore.init``: freeze what is alive; arm both policies for the first reused graph."""
    restore()
    if config.get("gc_freeze"):
        gc.freeze()
    _state["armed"] = config.get("gc_freeze") or config.get("gc_at_sync")


def at_reuse() -> None:
    """A graph was served from the cache: the first time after ``init``, the step repeats."""
    if not _state["armed"]:
        return
    _state["armed"] = False
    if config.get("gc_freeze"):
        gc.collect()
        gc.freeze()
    if config.get("gc_at_sync") and _state["saved"] is None:
        _state["saved"] = gc.get_threshold()
        t0, t1, t2 = _state["saved"]
        gc.set_threshold(max(t0, _CEILING), t1, t2)


def at_cut() -> None:
    """A graph cut (or a replayed step) ended: collect the generations CPython would have by now."""
    if _state["saved"] is None:
        return
    t0, t1, t2 = _state["saved"]
    c0, c1, c2 = gc.get_count()
    if t0 and c0 >= t0:
        gc.collect(2 if c2 >= t2 and c1 >= t1 else 1 if c1 >= t1 else 0)


def restore() -> None:
    """Put CPython's own thresholds back (a re-``init``)."""
    if _state["saved"] is not None:
        gc.set_threshold(*_state["saved"])
        _state["saved"] = None
