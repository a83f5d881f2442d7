"""Host reads, implicit syncs and eager fallback: where lazy values meet the host.

A host read of a pending value cuts the graph (``implicit_sync``, per ``MNCORE_IMPLICIT_SYNC``), except
inside a step ``mncore.capture`` records, where it becomes a guard; ops whose output shape depends on
values run eagerly on the execution device and continue lazily.
"""
from __future__ import annotations

import warnings
from typing import Any

import torch

from mncore.compile.lowering import lower
from mncore.config import settings
from mncore.errors import ImplicitSyncError, ImplicitSyncWarning, NotCompilableError, layout_error
from mncore.ir.meta import meta_of
from mncore.ir.values import Data, Node, describe_site
from mncore.observe import metrics
from mncore.trace import fallback as host_fallback
from mncore.trace import views
from mncore.trace.guards import Guard, evaluate
from mncore.trace.infer import FallbackNeeded
from mncore.trace.record import describe_host, new_tensor, record, value_of, wrap
from mncore.trace.sites import user_site
from mncore.trace.state import tracer
from mncore.trace.sync import sync
from mncore.trace.tensor import DEVICE_NAME, LazyTensor

aten = torch.ops.aten

_warned_sites: set = set()


def implicit_sync(reason: str) -> None:
    """A value is needed on the host while work is still pending: handle per the configured mode."""
    mode = settings.implicit_sync
    site = user_site() or ("<no Python frame: autograd engine thread>", 0, "backward")
    where = describe_site(site)
    if mode == "error" and not (tracer.recording is not None and tracer.recording.synced):
        # (a step being captured that called sync() before this read: its sync was only deferred)
        raise ImplicitSyncError(
            f"mncore: {reason} reads a tensor value before mncore.sync() at {where}; call mncore.sync() "
            "first or init(implicit_sync='warn'|'silent') to allow an implicit sync"
        )
    if mode == "warn" and site not in _warned_sites:
        _warned_sites.add(site)
        warnings.warn_explicit(
            f"mncore: implicit sync: {reason} at {where} reads a tensor value before mncore.sync(); "
            "the pending graph is cut here (this warning is shown once per call site)",
            ImplicitSyncWarning, site[0], site[1],
        )
    metrics.add("implicit_syncs")
    sync(reason="implicit")


def realize(t: LazyTensor, reason: str) -> torch.Tensor:
    """The concrete tensor (on the execution device) behind ``t``; syncs implicitly if pending."""
    if tracer.capture is not None:  # Context API tracing: even a ready value would be baked in
        if tracer.host_read is None:
            raise ImplicitSyncError(f"{reason} reads a tensor value while a Context function is being compiled")
        return tracer.host_read(t, reason)
    if tracer.recording is not None:
        buf = _guarded_read(t, reason)
        if buf is not None:
            return buf
        tracer.recording.refuse(f"{reason} reads a tensor value on the host")
    st = t.mn_storage
    with tracer.lock:  # another thread may be writing or cutting this value
        if type(st.value[0]) is Node:
            implicit_sync(reason)
        leaf = st.value[0]
    buf = leaf.wait()
    for op, args, _ in t.mn_chain:
        buf = views.apply_eager(op, args, buf)
    return as_traced(buf, t.mn_meta)


def host_write(op: str, hosts: list) -> None:
    """``op`` writes device values into the host tensors ``hosts``. A Context function being compiled
    cannot hold that (its calls run no Python, so the write would happen once, at compile time): raise.
    A step capture records that it cannot be replayed (a replay runs no Python and writes no host memory);
    the write itself reads the values."""
    if tracer.capture is None and tracer.recording is None:
        return
    names = ", ".join(map(describe_host, hosts))
    if tracer.capture is not None:
        raise ImplicitSyncError(f"{op} writes into the unregistered host tensor(s) {names}, which its calls would "
                                "leave unchanged; register them (register_buffer / register_param) so they live on "
                                "the device, or return the value and copy it after the call")
    tracer.recording.refuse(f"{op} writes into the host tensor(s) {names}, which a replay would not repeat; keep "
                            "them on the device, or copy after the call")


def _guarded_read(t: LazyTensor, reason: str) -> torch.Tensor | None:
    """A read of a pending value inside a step ``mncore.capture`` records: answered by a graph of its own,
    without cutting the step's graph, and kept as a guard that every replay checks (``trace.guards``).
    None where the value is not pending (a replay would have to check a value it does not compute) or
    host reads raise (``implicit_sync='error'``): the step is then refused as before."""
    if settings.implicit_sync == "error":
        return None
    with tracer.lock:
        ref = value_of(t)
    if type(ref[0]) is not Node:
        return None
    return read_as_guard(t, ref, reason, (), tracer.recording.guards)


def read_as_guard(t: LazyTensor, ref: tuple, reason: str, options: tuple, guards: list) -> torch.Tensor:
    """``t``'s value (traced as ``ref``) computed by a graph of its own, in the traced layout, and kept in
    ``guards`` with who read it where: the Context API's compile and a step capture records answer host
    reads this way."""
    buf = as_traced(evaluate(ref, t.mn_meta, options), t.mn_meta)
    guards.append(Guard(ref, t.mn_meta, buf.to("cpu", copy=True), reason, describe_site(user_site())))
    return buf


def as_traced(buf: torch.Tensor, meta: Any) -> torch.Tensor:
    """``buf`` in the traced layout and dtype: kernels may pick other layouts, and the 'double'
    precision policy keeps float32 values in float64 on the device."""
    shape, stride, dtype = meta
    if (buf.stride() != stride and buf.numel() > 1) or buf.dtype != dtype:
        buf = torch.empty_strided(shape, stride, dtype=dtype, device=buf.device).copy_(buf)
    return buf


def host_value(t: LazyTensor, reason: str) -> torch.Tensor:
    """``realize``, counted as bytes read back to the host."""
    buf = realize(t, reason)
    metrics.add("bytes_to_host", buf.numel() * buf.element_size())
    return buf


def realize_all(args: tuple, kwargs: dict, reason: str) -> tuple[list, dict]:
    """The arguments of a call with every lazy tensor realized (for ops that run eagerly)."""
    def conv(a: Any) -> Any:
        if isinstance(a, LazyTensor):
            return realize(a, reason)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        if type(a) is torch.device and a.type == DEVICE_NAME:
            return settings.exec_device
        return a

    return [conv(a) for a in args], {k: conv(v) for k, v in kwargs.items()}


def fallback(info: Any, func: Any, args: tuple, kwargs: dict, why: str) -> Any:
    """Ops whose output shape depends on values (nonzero, masked indexing, unique), or that PyTorch gives no
    shape function (the fused optimizers), run eagerly; ``why`` is shape inference's reason.

    On the static-shape devices (emu2, mncore2) they run on the host per ``settings.fallback``
    (``trace/fallback.py``).
    """
    if tracer.capture is not None:
        raise NotCompilableError(
            f"mncore: {info.name} at {describe_site(user_site())}: its output shape is not known before it runs; "
            "a Context function compiles to one graph with static shapes, so it cannot hold this op: run the step "
            f"in lazy mode (.to('mncore') and mncore.sync()), which runs such ops eagerly (PyTorch: {why})")
    static = settings.static_shapes
    reason = host_fallback.first_line(why, func)
    if static:
        host_fallback.admit(info.name, reason)
    metrics.count_fallback(info.name)
    if tracer.recording is not None:
        tracer.recording.refuse(f"{info.name} runs eagerly on the host ({reason})")
    real_args, real_kwargs = realize_all(args, kwargs, f"{info.name} (run eagerly: {reason})")
    out = lower(func)(*real_args, **real_kwargs)  # the kernel a graph would run (substitutes, overrides)
    if static:
        host_fallback.count_transfers((real_args, real_kwargs), out)

    def wrap(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            if o.layout != torch.strided:
                raise layout_error(o.layout, f"the result of {info.name}")
            meta = meta_of(o)
            return new_tensor((Data(meta, o), 0), meta)
        if isinstance(o, (list, tuple)):
            return type(o)(wrap(x) for x in o)
        return o

    return wrap(out)


def functional(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Trace a functional op, or run it eagerly when its output shape depends on values."""
    try:
        node = record(info, func, args, kwargs)
    except FallbackNeeded as e:
        return fallback(info, func, args, kwargs, str(e))
    return wrap(node)


def host_op(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Ops that read values on the host (``.item()``, ``torch.equal``)."""
    real_args, real_kwargs = realize_all(args, kwargs, _READ_NAMES.get(func, info.name))
    metrics.add("bytes_to_host", sum(a.numel() * a.element_size() for a in real_args if isinstance(a, torch.Tensor)))
    return func(*real_args, **real_kwargs)


_READ_NAMES = {aten._local_scalar_dense.default: ".item()/bool()/float()", aten.equal.default: "torch.equal",
               aten.allclose.default: "torch.allclose"}
