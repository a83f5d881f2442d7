"""Recording a step: run it traced, cut its graph, and describe how to run that graph again.

A :class:`Plan` says, for one recorded call, where each graph input comes from (an argument, a
storage that held it, a parameter's ``.grad``, a host tensor, a constant), what each graph output
updates (a storage it wrote, a new ``.grad``, a tensor the step made and Python kept) and what the
call returned. It holds the executable and weak references, never the traced nodes (they would keep
the step's old buffers alive).
"""
from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch.utils import _pytree as pytree

from mncore.compile.executable import Executable
from mncore.devices import registry
from mncore.devices.base import Device
from mncore.ir.meta import TensorMeta
from mncore.ir.targets import MutateFn, Seeded
from mncore.ir.values import Data, Node, Scalar, Seed, Site, describe_site
from mncore.capture.world import World, plain
from mncore.trace.guards import Guard, value_text
from mncore.trace.record import describe_host, value_of
from mncore.trace.state import Recording, tracer
from mncore.trace.sync import Submitted, cut
from mncore.trace.tensor import LazyTensor, Storage


@dataclass(eq=False)
class Plan:
    """How to run one recorded call again (see the module docstring for the binding kinds)."""

    exe: Executable | None
    device: Device
    bindings: list[tuple]
    scalars: list[Any]  # a Python number, or ("seed", k): the k-th seed the call drew
    scalar_sites: list[tuple[str, Site | None]]
    ops: tuple[tuple[int, str, Site | None], ...]  # (signature id, op, site) per node, for messages
    n_seeds: int
    out_metas: list[TensorMeta]
    effects: list[tuple]
    outputs: list[tuple]
    out_spec: Any
    hyperparameters: tuple
    problem: tuple[str, Site | None] | None = None
    program: Any = None  # replay's faster form of the bindings and effects, made at the first replay
    guards: tuple[tuple[int, Guard], ...] = ()  # (output, guard) per value read on the host (no traced ref)


def record(fn: Callable, args: tuple, kwargs: dict, leaves: list, world: World,
           previous: Plan | None) -> tuple[Any, Plan]:
    """Call ``fn`` traced as lazy mode would, with its graph cut at the end; returns its result and plan."""
    with tracer.lock:
        cut("capture")  # what was traced before the step is not part of it
    call = _Call(leaves, previous)
    hyper = world.hyperparameters()
    rec = Recording()
    saved_frames = tracer.record_frames
    tracer.recording, tracer.record_frames = rec, True
    try:
        with world.watching():
            out = fn(*args, **kwargs)
    finally:
        tracer.recording, tracer.record_frames = None, saved_frames
    out_leaves, out_spec = pytree.tree_flatten(out)
    problems = list(rec.problems) + call.reshaped()
    outputs: list[tuple] = []
    extra: list[tuple] = []
    out_storages: set[int] = set()
    first: dict[int, int] = {}
    with tracer.lock:
        for k, t in enumerate(out_leaves):
            if id(t) in first:  # the same object twice: returned twice
                outputs.append(("same", first[id(t)]))
                continue
            first[id(t)] = k
            if isinstance(t, LazyTensor):
                if id(t) in call.arg_ids and leaves[call.arg_ids[id(t)]] is t:
                    outputs.append(("arg", call.arg_ids[id(t)]))
                    continue
                ref = value_of(t)
                out_storages.add(id(t.mn_storage))
                if type(ref[0]) is not Node:  # not computed by the step, or a host read already ran it
                    problems.append((f"it returns a tensor whose value the step did not leave pending "
                                     f"({describe_host(t)}): it was read on the host inside the function, or the "
                                     "step did not compute it; read results after the call", None))
                    outputs.append(("value", None))
                    continue
                outputs.append(("ref", ref, t.mn_meta, t.requires_grad))
                extra.append(ref)
            elif isinstance(t, torch.Tensor):
                problems.append((f"it returns a host tensor ({describe_host(t)}); return mncore tensors", None))
                outputs.append(("value", None))
            elif not plain(t):
                problems.append((f"it returns a {type(t).__name__} object, which a replay cannot rebuild; return "
                                 "tensors and numbers in tuples, lists or dicts", None))
                outputs.append(("value", None))
            else:
                outputs.append(("value", t))
        if not problems and not rec.problems:  # (a refused step is not replayed: its reads need no checks)
            extra += [g.ref for g in rec.guards]
        done = cut("capture", tuple(extra))
    plan = _plan(done, rec, call, out_storages, world, outputs, out_spec, hyper)
    if problems and plan.problem is None:
        plan.problem = problems[0]
    return out, plan


class _Call:
    """The arguments of a recorded call as the plan needs them: which device value, storage and
    object each argument is, and the version of each host tensor argument when the call began."""

    def __init__(self, leaves: list, previous: Plan | None):
        self.leaves = leaves
        self.entry: dict[int, int] = {}  # id(device value) -> argument
        self.storages: dict[int, int] = {}  # id(storage) -> argument
        self.arg_ids: dict[int, int] = {}
        self.versions: dict[int, int] = {}
        self.layouts: dict[int, tuple] = {}  # argument -> (meta, view chain, storage) when the call began
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                self.arg_ids.setdefault(id(x), i)
                if isinstance(x, LazyTensor):
                    self.layouts[i] = (x.mn_meta, x.mn_chain, x.mn_storage)
                    self.storages.setdefault(id(x.mn_storage), i)
                    if type(x.mn_storage.value[0]) is Data:
                        self.entry.setdefault(id(x.mn_storage.value[0]), i)
                else:
                    self.versions[id(x)] = x._version
        hosts = [b[1]() for b in previous.bindings if b[0] == "host"] if previous else []
        self.host_versions = {id(t): t._version for t in hosts if t is not None}  # read again in this call

    def reshaped(self) -> list[tuple[str, None]]:
        """The problem of a call that changed an argument's shape, strides or storage in place: a replay
        writes an argument's values but leaves the tensor passed as it is (each call passes a new one)."""
        for i, (meta, chain, storage) in self.layouts.items():
            x = self.leaves[i]
            if x.mn_meta != meta or x.mn_chain != chain or x.mn_storage is not storage:
                return [(f"it changes argument {i} in place from shape {list(meta.shape)}, strides "
                         f"{list(meta.stride)} to {list(x.mn_meta.shape)}, {list(x.mn_meta.stride)} (resize_, "
                         "transpose_, as_strided_ or an out= tensor of another shape), which a replay cannot "
                         "repeat on the tensor passed; pass one of the final shape, or change it outside the function",
                         None)]
        return []


def _plan(done: Submitted | None, rec: Recording, call: _Call, out_storages: set, world: World,
          outputs: list, out_spec: Any, hyper: tuple) -> Plan:
    device = registry.active()
    if done is None:
        return Plan(None, device, [], [], [], (), len(rec.seeds), [], [], outputs, out_spec, hyper)
    leaves = call.leaves
    grads: dict[int, tuple] = {}  # id(.grad storage) -> its holder; a .grad is often a view (a Linear
    for p in world.params():     # weight's is the transpose of a matmul), so key its storage
        if isinstance(p.grad, LazyTensor):
            grads[id(p.grad.mn_storage)] = ("param", p)
    for i, x in enumerate(leaves):
        if isinstance(x, LazyTensor) and x.is_leaf and isinstance(x.grad, LazyTensor):
            grads.setdefault(id(x.grad.mn_storage), ("arg", i))

    def target(s: Storage) -> tuple:
        if id(s) in call.storages:  # an argument's storage: whatever argument is passed then
            return ("argstore", call.storages[id(s)])
        holder = grads.get(id(s))
        return ("grad", holder) if holder is not None else ("storages", (weakref.ref(s),))

    index = {(id(r[0]), r[1]): j for j, r in enumerate(done.roots)}
    written: dict[int, Storage] = {}
    effects: list[tuple] = []
    for j, group in enumerate(done.groups):
        for s in group:
            before = done.before[id(s)]
            if before is not None:
                written[id(before)] = s
                effects.append(("write", target(s), j))
            elif id(s) in grads:
                g = holder_tensor(grads[id(s)], leaves).grad
                effects.append(("grad_new", (grads[id(s)], g.mn_meta, g.mn_chain), j))
            elif id(s) not in out_storages:
                effects.append(("keep", weakref.ref(s), j))
    problem = None
    if any(o[0] == "ref" and o[3] for o in outputs) and not any(
            e[0] == "grad_new" or (e[0] == "write" and e[1][0] == "grad") for e in effects):
        problem = ("it returns a tensor with an autograd graph and computes no gradients: a replay returns "
                   "detached tensors, so a backward() outside would fail; call backward() inside the captured "
                   "function, or return detached values", None)
    uploads = {id(leaf): (t, v, site) for leaf, t, v, site in rec.uploads}
    bindings: list[tuple] = []
    for leaf in done.graph.leaves:
        if id(leaf) in call.entry:
            bindings.append(("arg", call.entry[id(leaf)]))
        elif id(leaf) in uploads:
            t, version, site = uploads[id(leaf)]
            i = call.arg_ids.get(id(t))
            start = call.versions.get(id(t), call.host_versions.get(id(t), version))
            if t._version != version or start != version:
                problem = problem or (f"the host tensor {describe_host(t)} is modified inside the function: a replay "
                                      "would not repeat that; keep it on the device, or change it outside", site)
            if i is not None and leaves[i] is t:
                bindings.append(("upload", i))
                continue
            value = t.detach().clone() if t.numel() <= 1 else None  # a scalar may turn out to be a constant
            bindings.append(("host", weakref.ref(t), value, site, leaf, describe_host(t)))
        elif id(leaf) in written:
            bindings.append(target(written[id(leaf)]))
        else:
            owners = [s for s in (w() for w in leaf.holders()) if s is not None and s.value[0] is leaf]
            grad_owner = next((s for s in owners if id(s) in grads), None)
            if grad_owner is not None:
                bindings.append(target(grad_owner))
            elif owners:
                bindings.append(("storages", tuple(weakref.ref(s) for s in owners)))
            else:
                bindings.append(("const", leaf))
    seed_index = {id(s): k for k, s in enumerate(rec.seeds)}
    scalars: list[Any] = [("seed", seed_index[id(s)]) if type(s) is Seed else s.value for s in done.graph.scalars]
    sites: list[tuple[str, Site | None]] = []
    ops = []
    for n in done.graph.order:
        name = _op_name(n)
        ops.append((n.sig.id, name, n.frame))
        sites += [(name, n.frame) for ref in n.inputs if isinstance(ref, Scalar)]
    resolved = [("ref", (index[(id(o[1][0]), o[1][1])], o[2])) if o[0] == "ref" else o for o in outputs]
    guards = tuple((index[(id(g.ref[0]), g.ref[1])], dataclasses.replace(g, ref=None))
                   for g in rec.guards if (id(g.ref[0]), g.ref[1]) in index)
    return Plan(done.exe, device, bindings, scalars, sites, tuple(ops), len(rec.seeds),
                [leaf.meta for leaf in done.outs], effects, resolved, out_spec, hyper, problem, guards=guards)


def holder_tensor(holder: tuple, leaves: list) -> Any:
    """The tensor whose ``.grad`` a ``("param", p)`` or ``("arg", i)`` holder names."""
    return holder[1] if holder[0] == "param" else leaves[holder[1]]


def _op_name(n: Node) -> str:
    target = n.target.op if isinstance(n.target, (Seeded, MutateFn)) else n.target
    return str(target)


class Disagreement(NamedTuple):
    """Why two recordings differ: ``reason`` is the same each time it happens (metrics count it),
    ``detail`` the values of this time (warnings show it); ``final``: no later recording can agree;
    ``read_changed``: only a value read on the host differs (new data, not a step capture misread)."""

    reason: str
    detail: str = ""
    final: bool = False
    read_changed: bool = False  # a value read on the host: data, which a re-validation may meet


def disagreement(old: Plan, new: Plan) -> Disagreement | None:
    """Why two recordings of one call key differ (None: they agree, and ``new`` can be replayed).

    On agreement, a host tensor read in both is bound to the tensor itself when it is the same
    object, and kept as a constant when both calls made an equal scalar (or empty) one.
    """
    if old.hyperparameters != new.hyperparameters:
        return Disagreement("an optimizer hyperparameter (lr, momentum, ...) changed between the two calls")
    if old.device is not new.device:
        return Disagreement("the active device changed")
    for (_, a), (_, b) in zip(old.guards, new.guards):  # (first: another value may explain another graph)
        if a.site == b.site and not a.holds(b.expected):
            return Disagreement(f"{b.read} reads a tensor value on the host (at {b.site}) that changes between "
                                "calls, and a replay cannot run the Python code that uses it; read it after the call",
                                f"{value_text(a.expected)}, then {value_text(b.expected)}", read_changed=True)
    if (old.exe is None) != (new.exe is None) or (old.exe is not None and old.exe.name != new.exe.name):
        return Disagreement(_graph_difference(old, new))
    for k, (a, b) in enumerate(zip(old.scalars, new.scalars)):
        if repr(a) != repr(b):  # repr: -0.0 differs from 0.0, NaN equals NaN
            op, site = new.scalar_sites[k]
            if isinstance(a, tuple) or isinstance(b, tuple):
                return Disagreement(f"the random numbers of {op} at {describe_site(site)} are drawn in another order")
            return Disagreement(
                f"the Python number passed to {op} at {describe_site(site)} differs between calls; capture would "
                "replay the old value. Make it a tensor on the device (a learning rate: lr=torch.tensor(..., "
                "device='mncore') with its scheduler), or for torch.optim.Adam/AdamW pass capturable=True",
                f"{a!r}, then {b!r}")
    if old.n_seeds != new.n_seeds:
        return Disagreement("the call draws a different number of random seeds")
    if [i for i, _ in old.guards] != [j for j, _ in new.guards]:
        return Disagreement("the step reads values on the host from different outputs than on the previous call")
    for k, (a, b) in enumerate(zip(old.bindings, new.bindings)):
        why = _binding_difference(a, b)
        if isinstance(why, Disagreement):
            return why
        if why == "const":  # the scalar is kept, so that a later recording (a re-validation) compares with it
            new.bindings[k] = ("const", b[4], b[2])
    if len(old.effects) != len(new.effects) or not all(map(_same_effect, old.effects, new.effects)):
        return Disagreement("the step writes different tensors than on the previous call")
    if [o[0] for o in old.outputs] != [o[0] for o in new.outputs] or old.out_spec != new.out_spec:
        return Disagreement("the function returns a different structure than on the previous call")
    for a, b in zip(old.outputs, new.outputs):
        if a[0] == "value" and repr(a[1]) != repr(b[1]):
            return Disagreement("the function returns a different Python value on each call",
                                f"{a[1]!r}, then {b[1]!r}")
        if a[0] != "value" and a[1] != b[1]:
            return Disagreement("the function returns different tensors than on the previous call")
    return None


def _graph_difference(old: Plan, new: Plan) -> str:
    for (sa, _, _), (sb, op, site) in zip(old.ops, new.ops):
        if sa != sb:
            return (f"the traced graph differs from the previous call from {op} at {describe_site(site)} on "
                    "(Python control flow that depends on values or on state the arguments do not show)")
    return (f"the traced graph differs from the previous call ({len(old.ops)} ops, then {len(new.ops)}; Python "
            "control flow that depends on values or on state the arguments do not show)")


def _binding_difference(a: tuple, b: tuple) -> str | Disagreement | None:
    """None: the same source; "const": two equal scalar host tensors made by the calls (``a`` may be the
    constant an earlier agreement made of such a tensor: ``("const", leaf, scalar)``); else why not."""
    if a[0] == "const" and b[0] == "host" and len(a) > 2:
        return "const" if _equal_scalars(a[2], b[2]) else Disagreement(
            f"the host tensor {b[5]} read at {describe_site(b[3])} holds another value than on the calls "
            "recorded before; pass it as an argument, or make it on the device")
    if a[0] != b[0]:
        return Disagreement("the step reads its inputs from different places than on the previous call")
    kind = a[0]
    if kind in ("arg", "upload"):
        return None if a[1] == b[1] else Disagreement("the step reads its arguments in a different order")
    if kind == "host":
        if a[1]() is not None and a[1]() is b[1]():
            return None
        if _equal_scalars(a[2], b[2]):
            return "const"
        # a new host tensor on every call: data (a batch prepared inside the step) or a constant, capture
        # cannot tell which, and replaying an old batch would be silently wrong
        return Disagreement(f"the host tensor {b[5]} read at {describe_site(b[3])} is made anew on every call; "
                            "pass it as an argument, or make it on the device", final=True)
    if kind == "const":
        return None if a[1] is b[1] else Disagreement("the step reads a device value no live tensor holds")
    if _same_place(a, b):
        return None
    return Disagreement("the step reads different tensors than on the previous call")


def _equal_scalars(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Two scalar (or empty) host tensors a step made, copied when recorded, of one dtype and value."""
    return a is not None and b is not None and a.dtype == b.dtype and torch.equal(a, b)


def _same_place(a: tuple, b: tuple) -> bool:
    """Two targets naming the same tensors: ``("storages", refs)``, ``("grad", holder)`` or
    ``("argstore", i)`` (the storage of the i-th argument)."""
    if a[0] != b[0]:
        return False
    if a[0] == "grad":
        return _same_holder(a[1], b[1])
    if a[0] == "argstore":
        return a[1] == b[1]
    xs, ys = [w() for w in a[1]], [w() for w in b[1]]
    return len(xs) == len(ys) and all(x is not None and x is y for x, y in zip(xs, ys))


def _same_holder(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and (a[1] is b[1] if a[0] == "param" else a[1] == b[1])


def _same_effect(a: tuple, b: tuple) -> bool:
    """Effects that update the same tensors from the same output (``keep``: a tensor each call makes)."""
    if a[0] != b[0] or a[2] != b[2]:
        return False
    if a[0] == "keep":
        return True
    if a[0] == "grad_new":
        return _same_holder(a[1][0], b[1][0]) and a[1][1:] == b[1][1:]
    return _same_place(a[1], b[1])
