"""``LazyTensor``: the ``mncore`` device tensor, whose value is a pending graph node or a device buffer.

Attributes: ``mn_meta`` (``TensorMeta``), ``mn_storage`` (the :class:`Storage` all views of one
base share), ``mn_chain`` (the view ops from the storage's value to this tensor), ``mn_view_cache``
(the chain's traced value, valid for one storage version and graph epoch) and, on views that
cannot be written through, ``mn_readonly`` (the op that made them).
"""
from __future__ import annotations

from time import perf_counter
from typing import Any

import torch

from mncore.ir.meta import TensorMeta
from mncore.ir.values import Data
from mncore.observe.metrics import accumulator as _accumulator
from mncore.observe.metrics import local as _local

DEVICE_NAME = "mncore"
_make_wrapper = torch.Tensor._make_wrapper_subclass


class Storage:
    """The value all views of one base tensor share; ``version`` changes on every write.

    ``committed`` is the device value the first write since the last graph cut replaced: the graph
    that computes the new value falls back to it if it fails, so one failing graph does not poison
    the tensor (it is dropped again when that graph is submitted).
    """

    __slots__ = ("value", "version", "meta", "committed", "__weakref__")

    def __init__(self, value: tuple, meta: TensorMeta):
        self.value = value
        self.version = 0
        self.meta = meta
        self.committed: tuple | None = None
        if type(value[0]) is Data:
            value[0].own(self)


class RefArg:
    """A traced value with metadata, usable as an argument when the tracer emits ops itself."""

    __slots__ = ("ref", "mn_meta")

    def __init__(self, ref: tuple, meta: TensorMeta):
        self.ref = ref
        self.mn_meta = meta


class ViewCache:
    """A view's traced value for one (storage version, graph epoch). The tracer holds these weakly to
    drop their values at the next graph cut; it never holds a tensor weakly, since ``swap_tensors``
    (``Module.to``, ``.double()`` of a model whose ``.grad`` is a view) refuses a tensor with a weak
    reference."""

    __slots__ = ("token", "ref", "__weakref__")

    def __init__(self, token: tuple | None, ref: tuple | None):
        self.token = token
        self.ref = ref


class LazyTensor(torch.Tensor):
    """A tensor on the ``mncore`` device whose value is a pending graph node or a device buffer."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    # Defaults read through the class: a tensor sets them only when they differ. Setting an attribute
    # of a tensor costs about 0.1 us (its __dict__ lives behind torch's C object), and every traced op
    # makes a tensor with no view chain and no cached view value.
    mn_chain: tuple = ()
    mn_view_cache: ViewCache | None = None

    @staticmethod
    def __new__(cls, meta: TensorMeta, storage: Storage, chain: tuple = (), requires_grad: bool = False):
        try:
            dev = _device_obj[0]
        except IndexError:  # the first mncore tensor: the device object can be made now (backend renamed)
            dev = device()
        r = _make_wrapper(cls, meta.shape, meta.stride, dtype=meta.dtype, device=dev, requires_grad=requires_grad)
        r.mn_meta = meta
        r.mn_storage = storage
        if chain:
            r.mn_chain = chain
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Inlined (the hot path of every traced op): route once per op, count the time as trace_s.
        t0 = perf_counter()
        _lock_acquire()
        try:
            hit = _routes.get(id(func))
            if hit is None:
                hit = _route(func)
            return hit[1](hit[0], func, args, kwargs or _NO_KWARGS)
        except Exception as e:
            if _in_backward():
                return _BackwardFailure(func, e)
            raise
        finally:
            _lock_release()
            try:
                _local.values["trace_s"] += perf_counter() - t0
            except AttributeError:  # this thread's first op
                _accumulator()["trace_s"] += perf_counter() - t0

    # Host-side conveniences that must not go through the tracer op by op.
    def __repr__(self, *, tensor_contents: Any = None) -> str:
        host = _host.host_value(self, "print()").cpu()
        body = repr(host.detach())
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return body[:-1] + suffix + ")" if body.endswith(")") else body

    def tolist(self) -> Any:
        return _host.host_value(self, ".tolist()").cpu().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __array__(self, dtype: Any = None) -> Any:
        return self.numpy()

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __deepcopy__(self, memo: dict) -> LazyTensor:
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            new._is_param = True
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto: int) -> Any:
        # Pickling (torch.save) stores the host value; it loads back as a CPU tensor.
        return self.cpu().__reduce_ex__(proto)


_device_obj: list[torch.device] = []


def device() -> torch.device:
    """``torch.device('mncore', 0)``, created once (after the backend is registered)."""
    if not _device_obj:
        _device_obj.append(torch.device(DEVICE_NAME, 0))
    return _device_obj[0]


# The handlers use LazyTensor, so they are imported after it (mncore/trace/__init__ imports this module first).
from mncore.trace import host as _host  # noqa: E402
from mncore.trace.dispatch import NO_KWARGS as _NO_KWARGS, route as _route, routes as _routes  # noqa: E402
from mncore.trace import backward as _backward  # noqa: E402
from mncore.trace.state import tracer as _tracer  # noqa: E402

_lock_acquire, _lock_release = _tracer.lock.acquire, _tracer.lock.release
_in_backward = _backward.in_backward
_BackwardFailure = _backward.BackwardFailure
