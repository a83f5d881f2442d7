"""Dispatch: which handler traces each aten op, chosen once per op from its schema facts.

``LazyTensor.__torch_dispatch__`` looks the handler up in ``routes`` (filled by ``route``, once per
op) and counts the time spent in mncore's tracer (``trace_s``). Factories with ``device='mncore'``
and no tensor argument reach the PrivateUse1 kernels made by ``factory`` instead.
"""
from __future__ import annotations

from time import perf_counter
from typing import Any

import torch
from torch.utils._mode_utils import no_dispatch

from mncore.config import require_init
from mncore.errors import layout_error
from mncore.ir import ops as opinfo
from mncore.observe import metrics
from mncore.trace import views
from mncore.trace.backward import BackwardFailure, in_backward
from mncore.trace.host import fallback, functional, host_op, host_value, host_write
from mncore.trace.infer import FallbackNeeded
from mncore.trace.record import cache_view, from_host, new_tensor, record
from mncore.trace.state import tracer
from mncore.trace.tensor import DEVICE_NAME, LazyTensor, ViewCache
from mncore.trace.writes import mutating, write

aten = torch.ops.aten
_ALIAS_IDS = frozenset(map(id, views.ALIASES))  # by id: see ``routes``


def _view(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Trace the view op now (its value is cached) and share the parent's storage for writes."""
    self = args[0]
    if not isinstance(self, LazyTensor):
        return functional(info, func, args, kwargs)
    if id(func) in _ALIAS_IDS:
        child = _child(self, self.mn_meta, self.mn_chain)
        cache_view(child, self.mn_view_cache)
        return child
    try:
        node = record(info, func, args, kwargs)
    except FallbackNeeded as e:
        return fallback(info, func, args, kwargs, str(e))
    struct, metas = node.sig.struct, node.sig.metas
    rest = tuple(tuple(a) if type(a) is list else a for a in args[1:])
    if kwargs:
        rest += tuple(tuple(v) if type(v) is list else v for v in kwargs.values())  # e.g. split(.., dim=2)
    token = (self.mn_storage.version, tracer.epoch)
    if struct is None:
        # Unknown view ops still read through the chain (so they see later writes to the base);
        # writing through them raises in views.inverse.
        child = _child(self, metas[0], self.mn_chain + ((func, rest, self.mn_meta.shape),))
        cache_view(child, ViewCache(token, (node, 0)))
        return child
    pieces = views.split_views(func, rest, self.mn_meta.shape)
    if pieces is None:
        return struct([_readonly(new_tensor((node, i), m), info.name) for i, m in enumerate(metas)])
    out = []
    for i, ((op, a), m) in enumerate(zip(pieces, metas)):
        child = _child(self, m, self.mn_chain + ((op, a, self.mn_meta.shape),))
        cache_view(child, ViewCache(token, (node, i)))
        out.append(child)
    return struct(out)


def _readonly(t: LazyTensor, op_name: str) -> LazyTensor:
    """Views we cannot write back through are traced as copies and refuse in-place writes."""
    t.mn_readonly = op_name
    return t


def _child(parent: LazyTensor, meta: tuple, chain: tuple) -> LazyTensor:
    t = LazyTensor(meta, parent.mn_storage, chain)
    if getattr(parent, "mn_readonly", None):
        t.mn_readonly = parent.mn_readonly
    return t


def device_arg(device: Any) -> torch.device | None:
    """A ``device=`` argument as a ``torch.device``; there is one ``mncore`` device (index 0), so
    ``mncore:1`` must not silently mean ``mncore:0``."""
    if device is None:
        return None
    d = device if isinstance(device, torch.device) else torch.device(device)
    if d.type == DEVICE_NAME and d.index not in (None, 0):
        raise ValueError(f"mncore has one device, 'mncore' (index 0); got {str(d)!r}. The execution device "
                         "behind it is chosen with mncore.init (e.g. init('pfvm:cuda:1'), init('mncore2:1'))")
    return d


def _to_copy(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    dev = device_arg(kwargs.get("device"))
    if dev is not None and dev.type != DEVICE_NAME:
        buf = host_value(args[0], ".cpu()/.to(device)")
        return func(buf, **dict(kwargs, device=dev))
    return functional(info, func, args, kwargs)


def _copy_(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    dst_lazy, src_lazy = isinstance(dst, LazyTensor), isinstance(src, LazyTensor)
    if dst_lazy and not src_lazy:
        if src.device.type == "meta":
            raise RuntimeError("mncore: cannot copy from a meta tensor")
        up = from_host(src)
        if not dst.mn_chain and up.mn_meta == dst.mn_meta:
            write(dst, up.mn_storage.value, up.mn_meta)
            return dst
        src = up
    elif src_lazy and not dst_lazy:
        host_write("copy_", [dst])
        return dst.copy_(host_value(src, "copy_ to a host tensor"), *args[2:])
    res = functional(opinfo.info_for(aten.copy.default), aten.copy.default, (dst, src), {})
    write(dst, res.mn_storage.value, res.mn_meta, "copy_")
    return dst


def _unsupported(what: str):
    def handler(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError(f"mncore: {info.name} is not supported: {what}")
    return handler


NO_KWARGS: dict = {}


# Keyed by ``id(func)``: an OpOverload's ``__hash__`` is a Python call, paid on every traced op
# otherwise; the entry holds ``func`` itself, so the id stays its own.
routes: dict = {}


def route(func: Any) -> tuple:
    """(op facts, handler, func) of ``func``, remembered in ``routes``."""
    info = opinfo.info_for(func)
    hit = routes[id(func)] = (info, _SPECIAL.get(func) or _HANDLERS[info.kind], func)
    return hit


def _storage_order(self: LazyTensor) -> LazyTensor:
    """``self``'s values laid out in its storage order (what eager re-reads after a metadata change),
    over the storage extent its strides address; elements it does not cover read as zeros."""
    shape, stride, dtype = self.mn_meta
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if 0 not in shape else 0
    flat = torch.zeros(extent, dtype=dtype, device=DEVICE_NAME)
    return torch.as_strided_scatter(flat, self, shape, stride) if extent else flat


def _restride_same_shape(self: LazyTensor, stride: list, offset: int) -> LazyTensor:
    """``x.as_strided_(x.shape, stride, offset)``: eager re-reads x's storage with new strides.

    PyTorch does this to keep channels_last after pooling. Lazy metadata is fixed, so the new
    values are computed (lay x out in its storage order, read it back with the new strides) and
    written into x, which keeps its traced strides.
    """
    shape, old_stride, dtype = self.mn_meta
    if stride == list(old_stride) and offset == 0:
        return self
    if 0 in shape:
        return self
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, old_stride))
    need = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    if offset < 0 or any(st < 0 for st in stride) or need > extent:
        raise RuntimeError(f"as_strided_: size {list(shape)}, stride {stride}, offset {offset} reach element "
                           f"{need - 1} of a storage of {extent} elements (out of bounds)")
    self.copy_(torch.as_strided(_storage_order(self), shape, stride, offset).clone())
    return self


def _set_wrapper_meta(func: Any, args: tuple, kwargs: dict) -> None:
    """Apply a metadata op to the wrapper's own sizes and strides (its meta kernel, no values), as
    ``torch.utils._python_dispatch.return_and_correct_aliasing`` does for ``inplace_view`` ops."""
    with no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            func(*args, **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)


def _resize(self: LazyTensor, shape: list) -> LazyTensor:
    """``resize_``/``resize_as_``: eager keeps the storage and reads it contiguously in the new shape; what
    grows past it is uninitialised (zeros here). The tensor takes a new storage holding that value, leaving
    the views of its old storage as they were."""
    if tuple(shape) == self.mn_meta.shape:
        return self
    if self.requires_grad:
        raise RuntimeError("cannot resize variables that require grad")
    n = 1
    for d in shape:
        n *= d
    flat = _storage_order(self)
    if n > flat.numel():
        flat = torch.cat([flat, torch.zeros(n - flat.numel(), dtype=flat.dtype, device=DEVICE_NAME)])
    new = flat[:n].reshape(list(shape)).clone()  # a base tensor (no view chain) with contiguous strides
    # the wrapper takes a storage of the new size (another wrapper's, so on this device) and the new shape
    _set_wrapper_meta(aten.set_.source_Storage_storage_offset,
                      (self, new.untyped_storage(), 0, list(shape), list(new.stride())), {})
    self.mn_meta, self.mn_storage, self.mn_chain, self.mn_view_cache = new.mn_meta, new.mn_storage, (), None
    self.__dict__.pop("mn_readonly", None)
    return self


def _metadata_inplace(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """In-place metadata ops: the tensor becomes the view the out-of-place op makes of it (same storage,
    so later writes through it reach its base), and its wrapper takes the view's sizes and strides."""
    self = args[0]
    base = info.name.split(".")[0]
    if not isinstance(self, LazyTensor) or base in ("set_", "_resize_output_"):
        raise NotImplementedError(
            f"mncore: {info.name} is not supported: tensor storage cannot be re-pointed on a lazy device; "
            f"create a new tensor instead")
    if base == "resize_":
        return _resize(self, list(args[1]))
    if base == "resize_as_":
        return _resize(self, list(args[1].shape))
    if base == "as_strided_" and list(args[1]) == list(self.mn_meta.shape):
        return _restride_same_shape(self, list(args[2]), (args[3] if len(args) > 3 else None) or 0)
    view = views.out_of_place(func)(*args, **kwargs)
    _set_wrapper_meta(func, args, kwargs)
    self.mn_meta, self.mn_chain = view.mn_meta, view.mn_chain
    cache_view(self, view.mn_view_cache)
    if getattr(view, "mn_readonly", None):
        self.mn_readonly = view.mn_readonly
    return self


def _to(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """``aten.to.*`` reaches dispatch only in inference mode: no change returns self, else _to_copy."""
    named = dict(zip(info.arg_names, args))
    named.update(kwargs)
    self = named.pop("self")
    other = named.get("other")
    dtype = other.dtype if isinstance(other, torch.Tensor) else named.get("dtype")
    device = other.device if isinstance(other, torch.Tensor) else named.get("device")
    kw = {}
    if dtype is not None and dtype != self.mn_meta.dtype:
        kw["dtype"] = dtype
    if device is not None and torch.device(device).type != DEVICE_NAME:
        kw["device"] = torch.device(device)
    if not kw and not named.get("copy"):
        return self
    return _to_copy(opinfo.info_for(aten._to_copy.default), aten._to_copy.default, (self,), kw)


_HANDLERS = {
    "metadata_inplace": _metadata_inplace,
    "to": _to,
    "functional": functional,
    "view": _view,
    "mutating": mutating,
    "host": host_op,
}


_SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.set_.source_Tensor: _unsupported("tensor storage cannot be re-pointed on a lazy device"),
}


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (a permutation of a contiguous layout): eager's preserve_format keeps
    such strides on a copy to another device."""
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def upload_kernel(src: torch.Tensor, *, dtype: Any = None, layout: Any = None, device: Any = None,
                  pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> Any:
    """``host_tensor.to('mncore')`` (``aten._to_copy`` dispatches on the target device's key): one upload.

    Without this kernel, ATen's composite ``_to_copy`` traces an ``empty`` factory and then a ``copy_``
    into it, two trips from C++ into Python per uploaded tensor. A conversion on the way (another dtype
    or memory format) or a non-dense source still takes that route: it has the eager semantics of strides.
    """
    if isinstance(src, LazyTensor):  # Python key excluded (e.g. inside torch.tensor): the traced _to_copy
        kw = {k: v for k, v in (("dtype", dtype), ("layout", layout), ("device", device),
                                ("memory_format", memory_format)) if v is not None}
        return LazyTensor.__torch_dispatch__(aten._to_copy.default, (), (src,), kw)
    require_init()
    device_arg(device)
    if layout not in (None, torch.strided) or src.layout != torch.strided:
        raise layout_error(src.layout if layout in (None, torch.strided) else layout,
                           f"a host tensor of shape {list(src.shape)}")
    if src.device.type == "meta":
        raise RuntimeError("mncore: cannot copy from a meta tensor")
    if dtype not in (None, src.dtype) or memory_format not in (None, torch.preserve_format) or not (
            src.is_contiguous() or _dense(src)):
        out = torch.empty_like(src, dtype=dtype, device=DEVICE_NAME,
                               memory_format=memory_format or torch.preserve_format)
        return out.copy_(src)
    return upload_dense(src)


def upload_dense(src: torch.Tensor) -> LazyTensor:
    """The upload itself, for a strided host tensor whose layout a copy keeps (dense), with no conversion:
    what ``upload_kernel`` checked, or ``tensor.mncore()`` with no arguments (its own checks)."""
    t0 = perf_counter()
    try:
        with tracer.lock:
            return from_host(src)
    finally:
        metrics.add("trace_s", perf_counter() - t0)


def factory(func: Any):
    info = opinfo.info_for(func)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        require_init()
        device_arg(kwargs.get("device"))
        t0 = perf_counter()
        try:
            with tracer.lock:
                return functional(info, func, args, kwargs)
        except Exception as e:
            if in_backward():
                return BackwardFailure(func, e)
            raise
        finally:
            metrics.add("trace_s", perf_counter() - t0)

    return kernel

