"""Recording ops: normalise a call's arguments into a template and input values, intern its
signature, and make the graph node; the values of tensors, uploads and new lazy tensors."""
from __future__ import annotations

from typing import Any

import torch

from mncore.config import require_init, settings
from mncore.devices import registry
from mncore.errors import layout_error
from mncore.ir import ops as opinfo
from mncore.ir.meta import TensorMeta, meta_of
from mncore.ir.targets import MutateFn, Seeded, random_supported
from mncore.ir.values import DEV, SCALAR_MARKERS, Data, Node, Scalar, Seed, T
from mncore.observe import metrics
from mncore.observe.hooks import op_observers
from mncore.trace import rng
from mncore.trace.infer import FallbackNeeded, signature
from mncore.trace.sites import user_site
from mncore.trace.state import tracer
from mncore.trace.tensor import DEVICE_NAME, LazyTensor, RefArg, Storage, ViewCache


def value_of(t: Any) -> tuple:
    """The traced value (producer, index) of a LazyTensor or RefArg, emitting view ops if needed."""
    if type(t) is RefArg:
        return t.ref
    ch = t.mn_chain
    st = t.mn_storage
    if not ch:
        return st.value
    token = (st.version, tracer.epoch)
    vc = t.mn_view_cache
    if vc is not None and vc.token == token:
        return vc.ref
    ref, meta = st.value, st.meta
    for op, args, _parent_shape in ch:
        ref, meta = emit1(op, (RefArg(ref, meta),) + tuple(args), {})
    cache_view(t, ViewCache(token, ref))
    return ref


def cache_view(t: LazyTensor, cached: ViewCache | None) -> None:
    """Set ``t``'s cached view value; the tracer drops it at the next graph epoch
    (``Tracer.new_epoch``), so a tensor that outlives the cut does not keep the old graph alive."""
    t.mn_view_cache = cached
    if cached is not None:
        tracer.view_cached.add(cached)


def new_tensor(ref: tuple, meta: TensorMeta) -> LazyTensor:
    st = Storage(ref, meta)
    if type(ref[0]) is Node:
        tracer.pending.add(st)
    return LazyTensor(meta, st)


def upload(tensor: torch.Tensor) -> Data:
    """A copy of a host tensor as a new device buffer (counted against the device's memory)."""
    require_init()
    if tensor.layout != torch.strided:
        raise layout_error(tensor.layout, f"a host tensor of shape {list(tensor.shape)}")
    nbytes = tensor.nbytes
    registry.active().check_upload(nbytes, tensor.shape, tensor.dtype)
    dev = settings.exec_device
    src = tensor.detach() if tensor.requires_grad else tensor  # a clone of it records no autograd history
    copy = src.clone() if src.is_cpu and dev.type == "cpu" else src.to(dev, copy=True)  # clone: cheaper than .to()
    leaf = Data(meta_of(tensor), copy)
    metrics.add("bytes_to_device", nbytes)
    if tracer.recording is not None:
        tracer.recording.uploads.append((leaf, tensor, tensor._version, user_site()))
    return leaf


def from_host(tensor: torch.Tensor) -> LazyTensor:
    """Upload a host tensor as a new lazy tensor."""
    leaf = upload(tensor)
    return new_tensor((leaf, 0), leaf.meta)


def _norm(a: Any, inputs: list, sigs: list, lift: bool, host_ok: bool = False) -> Any:
    """Replace tensors (and liftable floats) by markers; collect their values in order. ``host_ok``: CPU
    tensors of any shape are uploaded (index lists), not only 0-dim ones."""
    tp = type(a)
    if tp is LazyTensor or tp is RefArg:
        inputs.append(value_of(a))
        sigs.append(a.mn_meta)
        return T
    if tp is float:
        if lift:
            inputs.append(Scalar(a))
            return SCALAR_MARKERS[float]
        return a
    if tp is int or tp is bool or a is None or tp is str:
        return a
    if tp is list or tp is tuple:
        for x in a:
            if type(x) is not int:
                return tuple([_norm(x, inputs, sigs, lift, host_ok) for x in a])
        return tuple(a)  # sizes, strides, dims: nothing to replace
    if isinstance(a, torch.Tensor):
        if isinstance(a, LazyTensor):  # nn.Parameter-flavoured LazyTensor
            inputs.append(value_of(a))
            sigs.append(a.mn_meta)
            return T
        if a.device.type == "meta":
            raise RuntimeError("mncore: cannot mix meta tensors with mncore tensors")
        if tracer.capture is not None:
            tracer.capture.append(describe_host(a))
        elif a.dim() != 0 and not host_ok:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found a {a.device} tensor of shape "
                f"{tuple(a.shape)} mixed with mncore tensors; move it with .to('mncore') first"
            )
        leaf = upload(a)
        inputs.append((leaf, 0))
        sigs.append(leaf.meta)
        return T
    if tp is torch.device:
        return DEV if a.type == DEVICE_NAME else a
    if tp is torch.Generator:
        raise NotImplementedError(
            "mncore: explicit torch.Generator arguments are not supported; use torch.manual_seed "
            "(mncore draws a reproducible seed per random op)"
        )
    if tp is complex:
        return a
    return a


def describe_host(t: torch.Tensor) -> str:
    name = t.__dict__.get("_mncore_name")
    base = t._base
    if name is None and base is not None and base.__dict__.get("_mncore_name"):
        return f"{base.__dict__['_mncore_name']} (through a view)"
    return name or f"tensor(shape={list(t.shape)}, dtype={t.dtype}, device={t.device})"


def _norm_call(info: Any, args: tuple, kwargs: dict, inputs: list, sigs: list) -> tuple:
    lift = info.lift_pos
    targs = []
    for i, a in enumerate(args):
        tp = type(a)
        if tp is LazyTensor and not a.mn_chain:  # the common case, inlined
            inputs.append(a.mn_storage.value)
            sigs.append(a.mn_meta)
            targs.append(T)
        elif tp is int or tp is bool or a is None:
            targs.append(a)
        else:
            targs.append(_norm(a, inputs, sigs, i in lift, i in info.host_indices))
    tkw = tuple([(k, _norm(v, inputs, sigs, k in lift, k in info.host_indices))
                 for k, v in kwargs.items()]) if kwargs else ()
    return tuple(targs), tkw


def record(info: Any, target: Any, args: tuple, kwargs: dict) -> Node:
    """Trace one functional call; returns its node (``node.sig`` holds the output metadata)."""
    inputs: list = []
    sigs: list = []
    targs, tkw = _norm_call(info, args, kwargs, inputs, sigs)
    sig = signature(target, targs, tkw, inputs, sigs)
    if op_observers:
        for observe in op_observers:
            observe(info.op if not isinstance(target, MutateFn) else target.op, args, kwargs)
    if info.random:
        if not random_supported(info.op, info.has_generator):
            raise FallbackNeeded(f"random op {info.name} has no generator argument")
        target = _seeded(target, info.op)
        targs = (SCALAR_MARKERS[int],) + targs
        seed = Seed(rng.next_seed())
        inputs.insert(0, seed)
        if tracer.recording is not None:
            tracer.recording.seeds.append(seed)
    node = Node(target, (targs, tkw), tuple(inputs), sig, user_site() if tracer.record_frames else None)
    try:
        metrics.local.values["traced_ops"] += 1
    except AttributeError:  # this thread's first op
        metrics.accumulator()["traced_ops"] += 1
    return node


_seeded_cache: dict = {}


def _seeded(target: Any, op: Any) -> Any:
    s = _seeded_cache.get(target)
    if s is None:
        s = _seeded_cache[target] = Seeded(target, op)
    return s


def emit1(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, TensorMeta]:
    """Emit a single-output op on internal values; returns (ref, meta)."""
    node = record(opinfo.info_for(op), op, args, kwargs)
    return (node, 0), node.sig.metas[0]


def wrap(node: Node) -> Any:
    """The tensor(s) a recorded op returns, shaped like its eager result (one, none or a sequence)."""
    struct, metas = node.sig.struct, node.sig.metas
    if struct is None:
        return new_tensor((node, 0), metas[0])
    if struct == "none":
        return None
    outs = [None if m is None else new_tensor((node, i), m) for i, m in enumerate(metas)]
    return struct(outs)
