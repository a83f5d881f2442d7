"""Writes: in-place ops, out= ops and ops with mutable arguments, traced functionally and written back.

A write replaces the value of the target's storage; a write through a view scatters the new value
back into the base op by op (``views.inverse``), the functionalization rule PyTorch itself uses.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from mncore.ir import ops as opinfo
from mncore.ir.meta import TensorMeta, meta_of
from mncore.ir.targets import MutateFn
from mncore.ir.values import Data, describe_site
from mncore.trace import views
from mncore.trace.host import fallback, host_write, realize, realize_all
from mncore.trace.infer import FallbackNeeded
from mncore.trace.record import emit1, new_tensor, record
from mncore.trace.sites import user_site, warn_at
from mncore.trace.state import tracer
from mncore.trace.tensor import LazyTensor, RefArg

aten = torch.ops.aten


def write(target: LazyTensor, ref: tuple, meta: TensorMeta, what: str = "") -> None:
    """Make ``target`` hold the value ``ref``; views scatter into their storage's base."""
    tm = target.mn_meta
    if meta == tm and not target.mn_chain and "mn_readonly" not in target.__dict__:  # the common case
        st = target.mn_storage
        if type(st.value[0]) is Data:
            st.committed = st.value
        st.value = ref
        st.version += 1
        if type(ref[0]) is Data:
            ref[0].own(st)
        tracer.pending.add(st)
        return
    ro = getattr(target, "mn_readonly", None)
    if ro:
        raise NotImplementedError(f"mncore: cannot write in place through a view made by {ro}")
    if meta.dtype != tm.dtype:
        if not torch.can_cast(meta.dtype, tm.dtype):
            raise RuntimeError(f"result type {meta.dtype} can't be cast to the desired output type {tm.dtype}")
        ref, meta = emit1(aten._to_copy.default, (RefArg(ref, meta),), {"dtype": tm.dtype})
    if meta.shape != tm.shape:
        try:
            torch.broadcast_shapes(meta.shape, tm.shape)
            ok = torch.Size(torch.broadcast_shapes(meta.shape, tm.shape)) == torch.Size(tm.shape)
        except RuntimeError:
            ok = False
        if not ok:
            raise RuntimeError(
                f"output with shape {list(tm.shape)} doesn't match the broadcast shape {list(meta.shape)}"
                + (f" ({what})" if what else "")
            )
        ref, meta = emit1(aten.expand.default, (RefArg(ref, meta), list(tm.shape)), {})
        ref, meta = emit1(aten.clone.default, (RefArg(ref, meta),), {})
    st = target.mn_storage
    chain = target.mn_chain
    if chain:
        parents = [(st.value, st.meta)]
        for op, args, _ in chain[:-1]:
            parents.append(emit1(op, (RefArg(*parents[-1]),) + tuple(args), {}))
        for (op, args, parent_shape), (pref, pmeta) in zip(reversed(chain), reversed(parents)):
            kind, inv, iargs = views.inverse(op, args, parent_shape)
            if kind == "call":
                ref, meta = emit1(inv, (RefArg(ref, meta),) + tuple(iargs), {})
            elif kind == "scatter":
                ref, meta = emit1(inv, (RefArg(pref, pmeta), RefArg(ref, meta)) + tuple(iargs), {})
            elif pmeta.shape != meta.shape:  # expand: only a write that broadcasts nothing is well defined
                raise RuntimeError(
                    "unsupported operation: more than one element of the written-to tensor refers to a "
                    "single memory location. Please clone() the tensor before performing the operation."
                )
    if type(st.value[0]) is Data:
        st.committed = st.value
    st.value = ref
    st.version += 1
    if type(ref[0]) is Data:
        ref[0].own(st)
    tracer.pending.add(st)


_mutate_fns: dict = {}


def _mutated_targets(info: Any, args: tuple, kwargs: dict) -> list:
    """The LazyTensors an op writes to, flattened, in schema order (None where absent)."""
    out = []
    for pos, name in zip(info.mutated, info.mutated_names):
        v = kwargs[name] if name in kwargs else (args[pos] if pos < len(args) else None)
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return out


def _with_defaults(func: Any, args: tuple, kwargs: dict) -> tuple:
    """Spell out omitted positional defaults (``bernoulli_(p=0.5)``'s twin ``bernoulli.p`` has none)."""
    schema_args = func._schema.arguments
    if len(args) >= len(schema_args):
        return args
    extra = []
    for a in schema_args[len(args):]:
        if a.kwarg_only or a.name in kwargs or not a.has_default_value():
            break
        extra.append(a.default_value)
    return tuple(args) + tuple(extra) if extra else args


def _resize_outs(name: str, outs: list, metas: list) -> None:
    """out= tensors take their result's shape, as eager resizes them: silently when they hold no elements
    (``out=torch.empty(0)``), with a warning otherwise (PyTorch deprecates that). Writing the result into
    the old shape instead would broadcast it, or leave an empty out= tensor empty."""
    for t, m in zip(outs, metas):
        if t is None or m is None or t.mn_meta.shape == m.shape:
            continue
        if t.numel():
            site = user_site()
            warn_at(site, f"mncore: {name} at {describe_site(site)}: an out= tensor of shape {list(t.mn_meta.shape)} "
                          f"was resized to the result's shape {list(m.shape)}; PyTorch deprecates resizing an out= "
                          "tensor that has elements: pass one of the result's shape, or resize it to zero elements "
                          "first (t.resize_(0))", UserWarning)
        t.resize_(list(m.shape))


def mutating(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """In-place and out= ops: trace the functional twin (or clone-mutate-return) and write back."""
    targets = _mutated_targets(info, args, kwargs)
    for t in targets:
        if t is not None and not isinstance(t, LazyTensor):
            return _mixed_write(info, func, args, kwargs)
    if info.functional is not None:
        fkw = {k: v for k, v in kwargs.items() if k not in info.out_names} if info.out_names else kwargs
        fargs = _with_defaults(func, args, fkw)
        try:
            node = record(opinfo.info_for(info.functional), info.functional, fargs, fkw)
        except FallbackNeeded as e:
            return _run_eagerly(info, func, args, kwargs, str(e))
        if info.out_names:
            _resize_outs(info.name, targets, node.sig.metas)
        if node.sig.struct is None:
            write(targets[0], (node, 0), node.sig.metas[0], info.name)
        else:
            for i, (t, m) in enumerate(zip(targets, node.sig.metas)):
                write(t, (node, i), m, info.name)
        if info.out_names:
            outs = [kwargs[n] for n in info.out_names]
            return outs[0] if len(outs) == 1 else tuple(outs)
        return None if not func._schema.returns else args[0]
    fn = _mutate_fns.get(func)
    if fn is None:
        fn = _mutate_fns[func] = MutateFn(func, info)
    try:
        node = record(info, fn, args, kwargs)
    except FallbackNeeded as e:
        return _run_eagerly(info, func, args, kwargs, str(e))
    metas = node.sig.metas
    n_rets = sum(1 for a in info.returns_alias if a is None)
    for i, t in enumerate(targets):
        if t is not None:
            write(t, (node, n_rets + i), metas[n_rets + i], info.name)
    return _results(info, args, kwargs, (None if metas[k] is None else new_tensor((node, k), metas[k])
                                         for k in range(n_rets)))


def _results(info: Any, args: tuple, kwargs: dict, fresh: Iterator) -> Any:
    """What a mutating op returns: the argument for each result that aliases one, else the next of ``fresh``."""
    results = []
    for a in info.returns_alias:
        if a is None:
            results.append(next(fresh))
        else:
            name = info.arg_names[a]
            results.append(kwargs[name] if name in kwargs else args[a])
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)


def _run_eagerly(info: Any, func: Any, args: tuple, kwargs: dict, why: str) -> Any:
    """A mutating op that cannot be a graph node runs eagerly on copies of the tensors it writes, and each copy
    becomes its tensor's new value. Run on the device buffers themselves, it wrote into values other tensors
    share (a graph returns one buffer for equal outputs: Adam's new ``exp_avg`` and ``exp_avg_sq`` are both
    zeros, and ``Adam(fused=True, lr=tensor)`` wrote the second moment into the first, then NaN), or into a
    copy ``realize`` made for another layout, which was then dropped."""
    written: list[tuple[LazyTensor, torch.Tensor]] = []

    def copy(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return type(v)(copy(x) for x in v)
        if not isinstance(v, LazyTensor):
            return v
        buf = realize(v, f"{info.name} (run eagerly)")
        shape, stride, dtype = v.mn_meta
        c = torch.empty_strided(shape, stride, dtype=dtype, device=buf.device).copy_(buf)
        written.append((v, c))
        return c

    cargs, ckwargs = list(args), dict(kwargs)
    for pos, name in zip(info.mutated, info.mutated_names):
        if name in ckwargs:
            ckwargs[name] = copy(ckwargs[name])
        elif pos < len(cargs):
            cargs[pos] = copy(cargs[pos])
    res = fallback(info, func, tuple(cargs), ckwargs, why)
    for t, c in written:
        meta = meta_of(c)
        if info.out_names:
            _resize_outs(info.name, [t], [meta])
        write(t, (Data(meta, c), 0), meta, info.name)
    res = res if isinstance(res, tuple) else (res,)
    return _results(info, args, kwargs, iter([r for r, a in zip(res, info.returns_alias) if a is None]))


def _mixed_write(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """An op writing into a host tensor from device tensors: read the device values first."""
    hosts = [t for t in _mutated_targets(info, args, kwargs)
             if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor)]
    host_write(info.name, hosts)
    real_args, real_kwargs = realize_all(args, kwargs, info.name)
    return func(*real_args, **real_kwargs)
