"""``LazyTensor``: the ``mncore`` device tensor, and the tracer behind ``__torch_dispatch__``.

Every aten op on a LazyTensor becomes a :class:`~mncore.lazy.ir.Node`; nothing runs until
``mncore.sync()`` (or a host read) cuts the pending graph. Views share a :class:`Storage` and
read/write it through a view chain; in-place ops are traced as their functional variant and
written back, so the recorded graph is purely functional.
"""
from __future__ import annotations

import sys
import time
import weakref
from typing import Any

import torch

from mncore.lazy import ops as opinfo
from mncore.lazy import rng, views
from mncore.lazy.ir import SCALAR_MARKERS, Data, Node, Scalar, ScalarMarker, Seed, T
from mncore.runtime import metrics
from mncore.runtime.state import require_init, settings

aten = torch.ops.aten
DEVICE_NAME = "mncore"


class _DeviceToken:
    """Stands for ``device='mncore'`` in templates; lowered to the execution device."""

    def __repr__(self) -> str:
        return "DEV"


DEV = _DeviceToken()


class Storage:
    """The value all views of one base tensor share; ``version`` changes on every write."""

    __slots__ = ("value", "version", "meta", "__weakref__")

    def __init__(self, value: tuple, meta: tuple):
        self.value = value
        self.version = 0
        self.meta = meta


class _Tracer:
    """Global (not thread-local: autograd runs backward on its own thread) tracing state."""

    def __init__(self) -> None:
        self.pending: weakref.WeakSet = weakref.WeakSet()
        self.epoch = 0
        self.meta_cache: dict = {}
        self.sigs: list = []
        self.record_frames = False
        self.capture: list | None = None  # Context API tracing: host tensors read become constants
        self.observers: list = []  # callables (op, args, kwargs) told about every traced op


tracer = _Tracer()


class RefArg:
    """A traced value with metadata, usable as an argument when the tracer emits ops itself."""

    __slots__ = ("ref", "_m")

    def __init__(self, ref: tuple, meta: tuple):
        self.ref = ref
        self._m = meta


def arg_meta(a: Any) -> tuple | None:
    """(shape, stride, dtype) of a traced tensor argument (LazyTensor or internal value), else None."""
    return a._m if isinstance(a, (LazyTensor, RefArg)) else None


def _meta_of(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


class LazyTensor(torch.Tensor):
    """A tensor on the ``mncore`` device whose value is a pending graph node or a device buffer."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, meta: tuple, storage: Storage, chain: tuple = (), requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls, meta[0], meta[1], dtype=meta[2], device=_device(), requires_grad=requires_grad
        )
        r._m = meta
        r._st = storage
        r._ch = chain
        r._vc = None
        return r

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        try:
            hit = _dispatch_cache.get(func)
            if hit is None:
                hit = _dispatch_cache[func] = _route(func)
            return hit[1](hit[0], func, args, kwargs or _NO_KWARGS)
        finally:
            metrics._values["trace_s"] += time.perf_counter() - t0

    # Host-side conveniences that must not go through the tracer op by op.
    def __repr__(self, *, tensor_contents: Any = None) -> str:
        host = _host_value(self, "print()").cpu()
        body = repr(host.detach())
        suffix = f", device='{self.device}'"
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        return body[:-1] + suffix + ")" if body.endswith(")") else body

    def tolist(self) -> Any:
        return _host_value(self, ".tolist()").cpu().tolist()

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


_device_obj: torch.device | None = None


def _device() -> torch.device:
    global _device_obj
    if _device_obj is None:
        _device_obj = torch.device(DEVICE_NAME, 0)
    return _device_obj


# ---------------------------------------------------------------------------------------------
# values of tensors


def value_of(t: Any) -> tuple:
    """The traced value (producer, index) of a LazyTensor or RefArg, emitting view ops if needed."""
    if type(t) is RefArg:
        return t.ref
    ch = t._ch
    st = t._st
    if not ch:
        return st.value
    token = (st.version, tracer.epoch)
    vc = t._vc
    if vc is not None and vc[0] == token:
        return vc[1]
    ref, meta = st.value, st.meta
    for op, args, _parent_shape in ch:
        ref, meta = _emit1(op, (RefArg(ref, meta),) + tuple(args), {})
    t._vc = (token, ref)
    return ref


def new_tensor(ref: tuple, meta: tuple) -> LazyTensor:
    st = Storage(ref, meta)
    if type(ref[0]) is Node:
        tracer.pending.add(st)
    return LazyTensor(meta, st)


def from_host(tensor: torch.Tensor) -> LazyTensor:
    """Upload a host tensor as a new device buffer."""
    require_init()
    meta = _meta_of(tensor)
    leaf = Data(meta, tensor.to(settings.exec_device, copy=True))
    metrics._values["bytes_to_device"] += tensor.numel() * tensor.element_size()
    return new_tensor((leaf, 0), meta)


# ---------------------------------------------------------------------------------------------
# tracing


def _norm(a: Any, inputs: list, sigs: list, lift: bool) -> Any:
    """Replace tensors (and liftable floats) by markers; collect their values in order."""
    tp = type(a)
    if tp is LazyTensor or tp is RefArg:
        inputs.append(value_of(a))
        sigs.append(a._m)
        return T
    if tp is float:
        if lift:
            inputs.append(Scalar(a))
            return SCALAR_MARKERS[float]
        return a
    if tp is int or tp is bool or a is None or tp is str:
        return a
    if tp is list or tp is tuple:
        return tuple([_norm(x, inputs, sigs, lift) for x in a])
    if isinstance(a, torch.Tensor):
        if isinstance(a, LazyTensor):  # nn.Parameter-flavoured LazyTensor
            inputs.append(value_of(a))
            sigs.append(a._m)
            return T
        if a.device.type == "meta":
            raise RuntimeError("mncore: cannot mix meta tensors with mncore tensors")
        if tracer.capture is not None:
            tracer.capture.append(_describe_host(a))
        elif a.dim() != 0:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found a {a.device} tensor of shape "
                f"{tuple(a.shape)} mixed with mncore tensors; move it with .to('mncore') first"
            )
        meta = _meta_of(a)
        inputs.append((Data(meta, a.to(settings.exec_device, copy=True)), 0))
        sigs.append(meta)
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


def _describe_host(t: torch.Tensor) -> str:
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
        if tp is LazyTensor and not a._ch:  # the common case, inlined
            inputs.append(a._st.value)
            sigs.append(a._m)
            targs.append(T)
        elif tp is int or tp is bool or a is None:
            targs.append(a)
        else:
            targs.append(_norm(a, inputs, sigs, i in lift))
    tkw = tuple([(k, _norm(v, inputs, sigs, k in lift)) for k, v in kwargs.items()]) if kwargs else ()
    return tuple(targs), tkw


def _materialize(x: Any, it: Any, sit: Any) -> Any:
    if x is T:
        next(it)
        shape, stride, dtype = next(sit)
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    tp = type(x)
    if tp is ScalarMarker:
        return next(it).value
    if tp is tuple:
        return [_materialize(y, it, sit) for y in x]
    if x is DEV:
        return torch.device("meta")
    return x


# Meta kernels that enforce CUDA-only dtype rules (grouped_mm requires bf16 on CUDA, not on CPU):
# when they refuse, the op runs eagerly on the execution device instead.
_CUDA_ONLY_META_RULES = frozenset({"_grouped_mm.default", "grouped_mm.default"})


class FallbackNeeded(Exception):
    """Meta inference cannot know the output shape (data-dependent op): run it eagerly."""


def _infer(target: Any, targs: tuple, tkw: tuple, inputs: list, sigs: list) -> tuple:
    it, sit = iter(inputs), iter(sigs)
    margs = [_materialize(a, it, sit) for a in targs]
    mkw = {k: _materialize(v, it, sit) for k, v in tkw}
    try:
        out = target(*margs, **mkw)
    except NotImplementedError as e:
        raise FallbackNeeded(str(e)) from e
    except RuntimeError as e:
        msg = str(e)
        if getattr(target, "__name__", "") in _CUDA_ONLY_META_RULES:
            raise FallbackNeeded(msg) from e
        if "data-dependent" in msg or "DataDependent" in msg or "meta tensors" in msg or "Meta" in msg:
            raise FallbackNeeded(msg) from e
        raise
    if isinstance(out, torch.Tensor):
        return None, (_meta_of(out),)
    if isinstance(out, (tuple, list)):
        return type(out), tuple(_meta_of(o) if isinstance(o, torch.Tensor) else None for o in out)
    if out is None:
        return "none", ()
    raise FallbackNeeded(f"{target} returns a non-tensor value")


def _entry(target: Any, targs: tuple, tkw: tuple, inputs: list, sigs: list) -> tuple:
    key = (target, targs, tkw, tuple(sigs))
    cache = tracer.meta_cache
    entry = cache.get(key)
    if entry is None:
        struct, metas = _infer(target, targs, tkw, inputs, sigs)
        entry = (len(tracer.sigs), struct, metas)
        tracer.sigs.append(key)
        cache[key] = entry
    return entry


def _frame() -> Any:
    """The first user frame outside torch and mncore (only recorded for MNCORE_DEBUG)."""
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if "/torch/" not in fn and "/mncore/" not in fn:
            return (fn, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _record(info: Any, target: Any, args: tuple, kwargs: dict) -> tuple[Node, tuple]:
    """Trace one functional call; returns the node and its cache entry (sig_id, struct, metas)."""
    inputs: list = []
    sigs: list = []
    targs, tkw = _norm_call(info, args, kwargs, inputs, sigs)
    entry = _entry(target, targs, tkw, inputs, sigs)
    if tracer.observers:
        for observe in tracer.observers:
            observe(info.op if not isinstance(target, MutateFn) else target.op, args, kwargs)
    if info.random:
        if not rng.supported(info.op, info.has_generator):
            raise FallbackNeeded(f"random op {info.name} has no generator argument")
        target = _seeded(target, info.op)
        targs = (SCALAR_MARKERS[int],) + targs
        inputs.insert(0, Seed(rng.next_seed()))
    node = Node(target, (targs, tkw), tuple(inputs), entry[0], 0 if entry[1] is None else len(entry[2]),
                _frame() if tracer.record_frames else None)
    metrics._values["traced_ops"] += 1
    return node, entry


_seeded_cache: dict = {}


def _seeded(target: Any, op: Any) -> Any:
    s = _seeded_cache.get(target)
    if s is None:
        s = _seeded_cache[target] = rng.Seeded(target, op)
    return s


def _emit1(op: Any, args: tuple, kwargs: dict) -> tuple[tuple, tuple]:
    """Emit a single-output op on internal values; returns (ref, meta)."""
    node, entry = _record(opinfo.info_for(op), op, args, kwargs)
    return (node, 0), entry[2][0]


def _wrap(node: Node, entry: tuple) -> Any:
    struct, metas = entry[1], entry[2]
    if struct is None:
        return new_tensor((node, 0), metas[0])
    if struct == "none":
        return None
    outs = [None if m is None else new_tensor((node, i), m) for i, m in enumerate(metas)]
    return struct(outs)


def _functional(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    try:
        node, entry = _record(info, func, args, kwargs)
    except FallbackNeeded as e:
        return _fallback(info, func, args, kwargs, str(e))
    return _wrap(node, entry)


# ---------------------------------------------------------------------------------------------
# views


def _view(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Trace the view op now (its value is cached) and share the parent's storage for writes."""
    self = args[0]
    if not isinstance(self, LazyTensor):
        return _functional(info, func, args, kwargs)
    if func in views.ALIASES:
        child = _child(self, self._m, self._ch)
        child._vc = self._vc
        return child
    try:
        node, entry = _record(info, func, args, kwargs)
    except FallbackNeeded as e:
        return _fallback(info, func, args, kwargs, str(e))
    struct, metas = entry[1], entry[2]
    rest = tuple(tuple(a) if type(a) is list else a for a in args[1:])
    if kwargs:
        rest += tuple(tuple(v) if type(v) is list else v for v in kwargs.values())  # e.g. split(.., dim=2)
    token = (self._st.version, tracer.epoch)
    if struct is None:
        # Unknown view ops still read through the chain (so they see later writes to the base);
        # writing through them raises in views.inverse.
        child = _child(self, metas[0], self._ch + ((func, rest, self._m[0]),))
        child._vc = (token, (node, 0))
        return child
    pieces = views.split_views(func, rest, self._m[0])
    if pieces is None:
        return struct([_readonly(new_tensor((node, i), m), info.name) for i, m in enumerate(metas)])
    out = []
    for i, ((op, a), m) in enumerate(zip(pieces, metas)):
        child = _child(self, m, self._ch + ((op, a, self._m[0]),))
        child._vc = (token, (node, i))
        out.append(child)
    return struct(out)


def _readonly(t: LazyTensor, op_name: str) -> LazyTensor:
    """Views we cannot write back through are traced as copies and refuse in-place writes."""
    t._ro = op_name
    return t


def _child(parent: LazyTensor, meta: tuple, chain: tuple) -> LazyTensor:
    t = LazyTensor(meta, parent._st, chain)
    if getattr(parent, "_ro", None):
        t._ro = parent._ro
    return t


# ---------------------------------------------------------------------------------------------
# writes (in-place ops, out= ops, ops with mutable arguments)


def write(target: LazyTensor, ref: tuple, meta: tuple, what: str = "") -> None:
    """Make ``target`` hold the value ``ref``; views scatter into their storage's base."""
    tm = target._m
    if meta == tm and not target._ch and "_ro" not in target.__dict__:  # the common case
        st = target._st
        st.value = ref
        st.version += 1
        tracer.pending.add(st)
        return
    ro = getattr(target, "_ro", None)
    if ro:
        raise NotImplementedError(f"mncore: cannot write in place through a view made by {ro}")
    if meta[2] != tm[2]:
        if not torch.can_cast(meta[2], tm[2]):
            raise RuntimeError(f"result type {meta[2]} can't be cast to the desired output type {tm[2]}")
        ref, meta = _emit1(aten._to_copy.default, (RefArg(ref, meta),), {"dtype": tm[2]})
    if meta[0] != tm[0]:
        try:
            torch.broadcast_shapes(meta[0], tm[0])
            ok = torch.Size(torch.broadcast_shapes(meta[0], tm[0])) == torch.Size(tm[0])
        except RuntimeError:
            ok = False
        if not ok:
            hint = (" (an out= tensor cannot be resized on mncore: lazy tensors have static shapes; allocate it "
                    "with the result's shape or use the functional form)" if target._m[0] == (0,) else "")
            raise RuntimeError(
                f"output with shape {list(tm[0])} doesn't match the broadcast shape {list(meta[0])}"
                + (f" ({what})" if what else "") + hint
            )
        ref, meta = _emit1(aten.expand.default, (RefArg(ref, meta), list(tm[0])), {})
        ref, meta = _emit1(aten.clone.default, (RefArg(ref, meta),), {})
    st = target._st
    chain = target._ch
    if chain:
        parents = [(st.value, st.meta)]
        for op, args, _ in chain[:-1]:
            parents.append(_emit1(op, (RefArg(*parents[-1]),) + tuple(args), {}))
        for (op, args, parent_shape), (pref, pmeta) in zip(reversed(chain), reversed(parents)):
            kind, inv, iargs = views.inverse(op, args, parent_shape)
            if kind == "call":
                ref, meta = _emit1(inv, (RefArg(ref, meta),) + tuple(iargs), {})
            elif kind == "scatter":
                ref, meta = _emit1(inv, (RefArg(pref, pmeta), RefArg(ref, meta)) + tuple(iargs), {})
            elif pmeta[0] != meta[0]:  # expand: only a write that broadcasts nothing is well defined
                raise RuntimeError(
                    "unsupported operation: more than one element of the written-to tensor refers to a "
                    "single memory location. Please clone() the tensor before performing the operation."
                )
    st.value = ref
    st.version += 1
    tracer.pending.add(st)


class MutateFn:
    """Graph target for a mutating op without a functional twin: clone, mutate, return new values."""

    def __init__(self, op: Any, info: Any):
        self.op = op
        self.mutated = info.mutated
        self.names = info.mutated_names
        self.alias = info.returns_alias
        self.__name__ = f"functionalized_{info.name.replace('.', '_')}"

    def __call__(self, *args: Any, **kwargs: Any) -> tuple:
        args = list(args)
        news = []
        for pos, name in zip(self.mutated, self.names):
            if name in kwargs:
                kwargs[name] = _clone(kwargs[name])
                news.append(kwargs[name])
            elif pos < len(args):
                args[pos] = _clone(args[pos])
                news.append(args[pos])
            else:
                news.append(None)
        res = self.op(*args, **kwargs)
        res = res if isinstance(res, tuple) else (res,)
        rets = tuple(r for r, a in zip(res, self.alias) if a is None)
        flat = []
        for n in news:
            flat.extend(n if isinstance(n, list) else [n])
        return rets + tuple(flat)

    def __repr__(self) -> str:
        return self.__name__


def _clone(x: Any) -> Any:
    if isinstance(x, list):
        return [None if t is None else t.clone() for t in x]
    return None if x is None else x.clone()


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


def _mutating(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    targets = _mutated_targets(info, args, kwargs)
    for t in targets:
        if t is not None and not isinstance(t, LazyTensor):
            return _mixed_write(info, func, args, kwargs)
    if info.functional is not None:
        fkw = {k: v for k, v in kwargs.items() if k not in info.out_names} if info.out_names else kwargs
        fargs = _with_defaults(func, args, fkw)
        try:
            node, entry = _record(opinfo.info_for(info.functional), info.functional, fargs, fkw)
        except FallbackNeeded as e:
            return _fallback(info, func, args, kwargs, str(e))
        if entry[1] is None:
            write(targets[0], (node, 0), entry[2][0], info.name)
        else:
            for i, (t, m) in enumerate(zip(targets, entry[2])):
                write(t, (node, i), m, info.name)
        if info.out_names:
            outs = [kwargs[n] for n in info.out_names]
            return outs[0] if len(outs) == 1 else tuple(outs)
        return None if not func._schema.returns else args[0]
    fn = _mutate_fns.get(func)
    if fn is None:
        fn = _mutate_fns[func] = MutateFn(func, info)
    try:
        node, entry = _record(info, fn, args, kwargs)
    except FallbackNeeded as e:
        return _fallback(info, func, args, kwargs, str(e))
    metas = entry[2]
    n_rets = sum(1 for a in info.returns_alias if a is None)
    for i, t in enumerate(targets):
        if t is not None:
            write(t, (node, n_rets + i), metas[n_rets + i], info.name)
    results, k = [], 0
    for a in info.returns_alias:
        if a is None:
            results.append(None if metas[k] is None else new_tensor((node, k), metas[k]))
            k += 1
        else:
            name = info.arg_names[a]
            results.append(kwargs[name] if name in kwargs else args[a])
    if not results:
        return None
    return results[0] if len(results) == 1 else tuple(results)


def _mixed_write(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """An op writing into a host tensor from device tensors: read the device values first."""
    if tracer.capture is not None:
        hosts = [_describe_host(t) for t in _mutated_targets(info, args, kwargs)
                 if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor)]
        raise ImplicitSyncError(f"{info.name} writes into the unregistered host tensor(s) {', '.join(hosts)}; "
                                "register them (register_buffer / register_param) so they live on the device")
    real_args, real_kwargs = _realize_all(args, kwargs, info.name)
    return func(*real_args, **real_kwargs)


# ---------------------------------------------------------------------------------------------
# host reads, transfers and eager fallback


_warned_sites: set = set()


class ImplicitSyncError(RuntimeError):
    """Raised in ``implicit_sync='error'`` mode when a value is read before ``mncore.sync()``."""


class ImplicitSyncWarning(UserWarning):
    """A host read forced a sync of the pending graph (graph cut mid-step)."""


def _user_site() -> tuple[str, int, str]:
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if "/torch/" not in fn and "/mncore/" not in fn and not fn.startswith("<"):
            return fn, f.f_lineno, f.f_code.co_name
        f = f.f_back
    return "<no Python frame: autograd engine thread>", 0, "backward"


def implicit_sync(reason: str) -> None:
    """A value is needed on the host while work is still pending: handle per the configured mode."""
    from mncore.lazy.graph import sync

    mode = settings.implicit_sync
    site = _user_site()
    where = f"{site[0]}:{site[1]} in {site[2]}"
    if mode == "error":
        raise ImplicitSyncError(
            f"mncore: {reason} reads a tensor value before mncore.sync() at {where}; call mncore.sync() "
            "first or init(implicit_sync='warn'|'silent') to allow an implicit sync"
        )
    if mode == "warn" and site not in _warned_sites:
        _warned_sites.add(site)
        import warnings

        warnings.warn_explicit(
            f"mncore: implicit sync: {reason} at {where} reads a tensor value before mncore.sync(); "
            "the pending graph is cut here (this warning is shown once per call site)",
            ImplicitSyncWarning, site[0], site[1],
        )
    metrics._values["implicit_syncs"] += 1
    sync(reason="implicit")


def realize(t: LazyTensor, reason: str) -> torch.Tensor:
    """The concrete tensor (on the execution device) behind ``t``; syncs implicitly if pending."""
    if tracer.capture is not None:  # Context API tracing: even a ready value would be baked in
        raise ImplicitSyncError(f"{reason} reads a tensor value while a Context function is being compiled")
    st = t._st
    if type(st.value[0]) is Node:
        implicit_sync(reason)
    buf = st.value[0].wait()
    for op, args, _ in t._ch:
        buf = views.apply_eager(op, args, buf)
    shape, stride, dtype = t._m
    # kernels may pick other layouts, and the 'double' precision policy keeps float32 values in
    # float64 on the device: hand back the traced layout and dtype
    if (buf.stride() != stride and buf.numel() > 1) or buf.dtype != dtype:
        buf = torch.empty_strided(shape, stride, dtype=dtype, device=buf.device).copy_(buf)
    return buf


def _host_value(t: LazyTensor, reason: str) -> torch.Tensor:
    buf = realize(t, reason)
    metrics._values["bytes_to_host"] += buf.numel() * buf.element_size()
    return buf


def _realize_all(args: tuple, kwargs: dict, reason: str) -> tuple[list, dict]:
    def conv(a: Any) -> Any:
        if isinstance(a, LazyTensor):
            return realize(a, reason)
        if isinstance(a, (list, tuple)):
            return type(a)(conv(x) for x in a)
        if type(a) is torch.device and a.type == DEVICE_NAME:
            return settings.exec_device
        return a

    return [conv(a) for a in args], {k: conv(v) for k, v in kwargs.items()}


def _fallback(info: Any, func: Any, args: tuple, kwargs: dict, why: str) -> Any:
    """Ops whose output shape depends on values (nonzero, masked indexing, unique) run eagerly.

    Not on the simulated MN-Core devices: their compiler needs every shape fixed in advance.
    """
    if settings.static_shapes:
        from mncore.compiler.pipeline import StaticShapeError

        raise StaticShapeError(
            f"mncore: {info.name} has a data-dependent output shape ({why}); {settings.device} compiles graphs "
            f"with static shapes only, so it cannot run there. Compute it on the host (.cpu()) or use a pfvm device")
    metrics.count_fallback(info.name)
    real_args, real_kwargs = _realize_all(args, kwargs, f"{info.name} (data-dependent shape)")
    out = func(*real_args, **real_kwargs)

    def wrap(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            meta = _meta_of(o)
            return new_tensor((Data(meta, o), 0), meta)
        if isinstance(o, (list, tuple)):
            return type(o)(wrap(x) for x in o)
        return o

    return wrap(out)


def _host_op(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    real_args, real_kwargs = _realize_all(args, kwargs, _READ_NAMES.get(func, info.name))
    metrics._values["bytes_to_host"] += sum(
        a.numel() * a.element_size() for a in real_args if isinstance(a, torch.Tensor))
    return func(*real_args, **real_kwargs)


_READ_NAMES = {aten._local_scalar_dense.default: ".item()/bool()/float()", aten.equal.default: "torch.equal"}


def _to_copy(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    dev = kwargs.get("device")
    if dev is not None and torch.device(dev).type != DEVICE_NAME:
        src = args[0]
        buf = _host_value(src, ".cpu()/.to(device)")
        kw = dict(kwargs)
        kw["device"] = torch.device(dev)
        return func(buf, **kw)
    return _functional(info, func, args, kwargs)


def _copy_(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    dst_lazy, src_lazy = isinstance(dst, LazyTensor), isinstance(src, LazyTensor)
    if dst_lazy and not src_lazy:
        if src.device.type == "meta":
            raise RuntimeError("mncore: cannot copy from a meta tensor")
        up = from_host(src)
        if not dst._ch and up._m == dst._m:
            write(dst, up._st.value, up._m)
            return dst
        src = up
    elif src_lazy and not dst_lazy:
        return dst.copy_(_host_value(src, "copy_ to a host tensor"), *args[2:])
    res = _functional(opinfo.info_for(aten.copy.default), aten.copy.default, (dst, src), {})
    write(dst, res._st.value, res._m, "copy_")
    return dst


def _unsupported(what: str):
    def handler(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        raise NotImplementedError(f"mncore: {info.name} is not supported: {what}")
    return handler


_NO_KWARGS: dict = {}
_dispatch_cache: dict = {}


def _route(func: Any) -> tuple:
    info = opinfo.info_for(func)
    return info, _SPECIAL.get(func) or _HANDLERS[info.kind]


def _restride_same_shape(self: LazyTensor, stride: list, offset: int) -> LazyTensor:
    """``x.as_strided_(x.shape, stride, offset)``: eager re-reads x's storage with new strides.

    PyTorch does this to keep channels_last after pooling. Lazy metadata is fixed, so the new
    values are computed (lay x out in its storage order, read it back with the new strides) and
    written into x, which keeps its traced strides.
    """
    shape, old_stride, dtype = self._m
    if stride == list(old_stride) and offset == 0:
        return self
    if 0 in shape:
        return self
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, old_stride))
    need = offset + 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    if offset < 0 or any(st < 0 for st in stride) or need > extent:
        raise RuntimeError(f"as_strided_: size {list(shape)}, stride {stride}, offset {offset} reach element "
                           f"{need - 1} of a storage of {extent} elements (out of bounds)")
    flat = torch.zeros(extent, dtype=dtype, device=DEVICE_NAME)
    flat = torch.as_strided_scatter(flat, self, shape, old_stride)
    self.copy_(torch.as_strided(flat, shape, stride, offset).clone())
    return self


def _metadata_inplace(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    if info.name == "as_strided_" and isinstance(self, LazyTensor) and list(args[1]) == list(self._m[0]):
        return _restride_same_shape(self, list(args[2]), (args[3] if len(args) > 3 else None) or 0)
    raise NotImplementedError(
        f"mncore: {info.name} changes a tensor's shape or strides in place, which lazy tensors (static "
        f"metadata) cannot do; use the out-of-place form, e.g. x = x.{info.name.split('.')[0].rstrip('_')}(...)"
    )


def _to(info: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """``aten.to.*`` reaches dispatch only in inference mode: no change returns self, else _to_copy."""
    named = dict(zip(info.arg_names, args))
    named.update(kwargs)
    self = named.pop("self")
    other = named.get("other")
    dtype = other.dtype if isinstance(other, torch.Tensor) else named.get("dtype")
    device = other.device if isinstance(other, torch.Tensor) else named.get("device")
    kw = {}
    if dtype is not None and dtype != self._m[2]:
        kw["dtype"] = dtype
    if device is not None and torch.device(device).type != DEVICE_NAME:
        kw["device"] = torch.device(device)
    if not kw and not named.get("copy"):
        return self
    return _to_copy(opinfo.info_for(aten._to_copy.default), aten._to_copy.default, (self,), kw)


_HANDLERS = {
    "metadata_inplace": _metadata_inplace,
    "to": _to,
    "functional": _functional,
    "view": _view,
    "mutating": _mutating,
    "host": _host_op,
}

_SPECIAL = {
    aten._to_copy.default: _to_copy,
    aten.copy_.default: _copy_,
    aten.set_.source_Tensor: _unsupported("tensor storage cannot be re-pointed on a lazy device"),
    aten.resize_.default: _unsupported("lazy tensors have static shapes; create a new tensor instead"),
}


# ---------------------------------------------------------------------------------------------
# factories (device='mncore' with no tensor argument reaches the PrivateUse1 kernel, not dispatch)


def factory(func: Any):
    info = opinfo.info_for(func)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        require_init()
        t0 = time.perf_counter()
        try:
            return _functional(info, func, args, kwargs)
        finally:
            metrics._values["trace_s"] += time.perf_counter() - t0

    return kernel
