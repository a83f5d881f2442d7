"""Replaying a plan: bind its inputs to what holds them now, submit its executable, apply its writes.

Everything is resolved before anything changes, so a replay that cannot bind (a tensor it reads was
freed, a ``.grad`` is gone) changes nothing and the caller traces the step instead. A step that read
values on the host when it was recorded (guards) waits for its graph and checks those values before
it writes anything; when one changed, nothing is written and the caller traces the step. A plan is turned
into a :class:`Program` once: the common cases (one storage read or written) become plain weak
references, so a replay costs a few attribute reads per tensor.
"""
from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils import _pytree as pytree

from mncore.capture.plan import Plan, holder_tensor
from mncore.execute import Job, executor
from mncore.ir.latch import Latch
from mncore.ir.values import Data
from mncore.observe import metrics, timeline
from mncore.trace import rng
from mncore.trace.record import new_tensor, upload
from mncore.trace.state import tracer
from mncore.trace.sync import cut, mark_host_end, store
from mncore.trace.tensor import LazyTensor, Storage


class Unbound(Exception):
    """The replay cannot run as recorded (an input or target is gone); nothing was changed, and the
    message says why."""


class GuardChanged(Unbound):
    """A value the step read on the host when it was recorded is another now (the graph computed it):
    the Python branch taken then may not be the one to take; nothing the step writes was changed."""


class Program:
    """A plan's bindings and effects, sorted for speed: ``reads`` are weak references to storages
    (None where the binding needs :func:`_resolve`), ``writes`` are (storage ref, output) pairs, ``grads``
    the new ``.grad`` of a parameter as (parameter, meta, view chain, output), and ``others`` the effects
    that need :func:`_targets`. ``single``: the function returns one value, not a container of them."""

    def __init__(self, plan: Plan):
        self.reads = [b[1][0] if _one_storage(b) else None for b in plan.bindings]
        self.writes = [(e[1][1][0], e[2]) for e in plan.effects if e[0] == "write" and _one_storage(e[1])]
        self.grads = [(e[1][0][1], e[1][1], e[1][2], e[2]) for e in plan.effects if _param_grad(e)]
        self.others = [e for e in plan.effects if not (e[0] == "write" and _one_storage(e[1])) and not _param_grad(e)]
        self.seeded = [i for i, v in enumerate(plan.scalars) if type(v) is tuple]
        self.single = plan.out_spec.is_leaf()


def _one_storage(target: tuple) -> bool:
    return target[0] == "storages" and len(target[1]) == 1


def _param_grad(effect: tuple) -> bool:
    return effect[0] == "grad_new" and effect[1][0][0] == "param"


def replay(plan: Plan, leaves: list) -> Any:
    """Run ``plan`` on the call's flattened arguments; returns the call's result (raises Unbound)."""
    t0 = timeline.now()
    prog = plan.program or Program(plan)
    plan.program = prog
    with tracer.lock:
        if tracer.pending:
            cut("capture")  # values written before the call must be device values to bind them
        inputs = []
        for w, b in zip(prog.reads, plan.bindings):
            if w is not None:
                s = w()
                if s is None:
                    raise Unbound("a tensor the step reads was freed")
                v = s.value[0]
                if type(v) is not Data:
                    raise Unbound("a tensor the step reads holds no device value")
            else:
                v = _resolve(b, leaves)
            inputs.append(v)
        writes = []
        for w, j in prog.writes:
            s = w()
            if s is None:
                raise Unbound("a tensor the step writes was freed")
            writes.append((s, j))
        others = [(e, _targets(e, leaves)) for e in prog.others]
        outs: list[Data] = []
        if plan.exe is not None:
            plan.device.check_memory(plan.exe)
            scalars = list(plan.scalars)
            stream = rng.get_state() if plan.guards else None  # given back if a read changed: the call is traced
            if plan.n_seeds:
                draws = [rng.next_seed() for _ in range(plan.n_seeds)]
                for i in prog.seeded:
                    scalars[i] = draws[scalars[i][1]]
            ready = Latch()
            name = plan.exe.name
            for meta in plan.out_metas:
                leaf = Data(meta, ready=ready)
                leaf.graph = name
                outs.append(leaf)
            dropped: list = []  # .grad tensors replaced: freed by the worker after the run
            if not plan.guards:
                _apply(prog, writes, others, outs, dropped)
            t_submit = timeline.now()
            waited = executor.submit(Job(exe=plan.exe, leaves=inputs, scalars=scalars, outs=outs,
                                         release=[] if plan.guards else dropped))
            if waited:  # the wait for the worker is not the host's work: two spans around it
                timeline.record("host", "replay", t0, t_submit)
                t0 = t_submit + waited
            if plan.guards:
                t_wait = timeline.now()
                changed = _changed_read(plan, outs)
                timeline.record("host", "replay", t0, t_wait)
                t0 = timeline.now()
                if changed is not None:
                    rng.set_state(stream)  # the traced call draws the seeds lazy mode would
                    raise GuardChanged(changed)
                _apply(prog, writes, others, outs, dropped)
                for leaf in outs:  # the graph has run: what they replace is no value to fall back to
                    if leaf.error is None:
                        leaf.fallback = None
        else:
            for _ in range(plan.n_seeds):
                rng.next_seed()
        result: list[Any] = []
        for o in plan.outputs:
            kind = o[0]
            result.append(new_tensor((outs[o[1][0]], 0), o[1][1]) if kind == "ref" else leaves[o[1]]
                          if kind == "arg" else result[o[1]] if kind == "same" else o[1])
    t1 = timeline.now()
    timeline.record("host", "replay", t0, t1)
    mark_host_end(t1)
    metrics.add("replays")
    return result[0] if prog.single else pytree.tree_unflatten(result, plan.out_spec)


def _apply(prog: Program, writes: list, others: list, outs: list[Data], dropped: list) -> None:
    """The replay's writes: each storage, ``.grad`` and kept tensor the step updates takes its output."""
    for s, j in writes:
        store(s, outs[j])
    with torch._C.DisableTorchFunctionSubclass():  # .grad of an mncore tensor: no override to look for
        for param, meta, chain, j in prog.grads:
            _new_grad(param, meta, chain, outs[j], dropped)
        for (kind, _, j), found in others:
            if kind == "grad_new":
                holder, (_, meta, chain) = found
                _new_grad(holder, meta, chain, outs[j], dropped)
            else:
                for st in found:
                    store(st, outs[j])


def _changed_read(plan: Plan, outs: list[Data]) -> str | None:
    """Waits for the graph's values of the host reads the step was recorded with; describes the first
    that changed (None: all hold, or the graph failed, which its outputs then report as any replay's)."""
    for j, guard in plan.guards:
        try:
            value = outs[j].wait(for_user=False)
        except Exception:  # noqa: BLE001 - the graph's error, raised by the reads of its outputs
            return None
        if not guard.holds(value):
            return f"the value {guard.read} read on the host at {guard.site} changed"
    return None


def _new_grad(param: Any, meta: Any, chain: tuple, out: Data, dropped: list) -> None:
    """``param.grad`` becomes ``out``: in its present tensor when nobody else can see that one (cheaper than
    a new tensor), else in a new tensor (the old one goes to ``dropped``, freed after the run)."""
    old = param.grad
    if _unshared(old, meta, chain):
        store(old.mn_storage, out)
    else:
        dropped.append(old)
        param.grad = LazyTensor(meta, Storage((out, 0), out.meta), chain)


def _unshared(t: Any, meta: Any, chain: tuple) -> bool:
    """A ``.grad`` tensor shaped as the recorded one that only its parameter refers to (no other name,
    no other view of its storage): writing its storage cannot be told apart from assigning a new
    tensor. Counted: the parameter's slot, the caller's name, this argument and getrefcount's; for
    the storage, the tensor and getrefcount's."""
    return (type(t) is LazyTensor and t.mn_meta == meta and t.mn_chain == chain and sys.getrefcount(t) == 4
            and sys.getrefcount(t.mn_storage) == 2)


def _resolve(b: tuple, leaves: list) -> Data:
    kind = b[0]
    if kind == "arg":
        v = leaves[b[1]].mn_storage.value[0]
    elif kind == "upload":
        v = upload(leaves[b[1]])
    elif kind == "host":
        t = b[1]()
        if t is None:
            raise Unbound("a host tensor the step reads was freed")
        v = upload(t)
    elif kind == "const":
        v = b[1]
    else:
        v = _one_value(_place(b, leaves))
    if type(v) is not Data:
        raise Unbound("a tensor the step reads holds no device value")
    return v


def _place(b: tuple, leaves: list) -> list[Storage]:
    """The storages a ``("storages", refs)``, ``("grad", holder)`` or ``("argstore", i)`` target names now."""
    if b[0] == "grad":
        g = holder_tensor(b[1], leaves).grad
        if not isinstance(g, LazyTensor):
            raise Unbound("a .grad the step reads or accumulates into is gone")
        return [g.mn_storage]
    if b[0] == "argstore":
        x = leaves[b[1]]
        if not isinstance(x, LazyTensor):
            raise Unbound("an argument the step writes is not an mncore tensor")
        return [x.mn_storage]
    found = [s for s in (w() for w in b[1]) if s is not None]
    if not found:
        raise Unbound("a tensor the step reads or writes was freed")
    return found


def _one_value(storages: list[Storage]) -> Any:
    v = storages[0].value[0]
    if any(s.value[0] is not v for s in storages[1:]):
        raise Unbound("tensors that held one value when the step was recorded hold different values now")
    return v


def _targets(effect: tuple, leaves: list) -> Any:
    kind, target, _ = effect
    if kind == "grad_new":
        return holder_tensor(target[0], leaves), target
    if kind == "keep":
        s = target()
        return [] if s is None else [s]
    return _place(target, leaves)
