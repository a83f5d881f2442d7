"""The Context API (MLSDK style): compile a ``dict -> dict`` step once, then call it with no tracing.

Compiling traces the function with the lazy tracer: every registered tensor is temporarily bound
to a lazy twin holding its device value (``bind``: swapped, or substituted where weak references
forbid a swap), so the model and optimizer the function closes over operate on device tensors;
the sample inputs become lazy placeholders. Values the function reads on the host are computed
from the sample and guarded (``guards``). The resulting graph goes through the same graph key,
compile cache and executor as lazy mode. A call binds inputs and registered values to the
executable's placeholders and submits one job: no op is traced.
"""
from __future__ import annotations

import contextlib
import gc
import os
import pathlib
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from mncore import config
from mncore.cache import disk as disk_cache
from mncore.compile import codegen
from mncore.config import settings
from mncore.context.bind import Binder
from mncore.context.guards import GuardRecorder
from mncore.context.naming import get_tensor_name, set_tensor_name
from mncore.context.rebind import RebindWatch
from mncore.context.storage import CacheOptions
from mncore.devices import Device, parse
from mncore.errors import GuardError, ImplicitSyncError, InputError
from mncore.execute import Job, executor
from mncore.ir.latch import Latch
from mncore.ir.meta import TensorMeta, meta_of
from mncore.ir.values import Data, Node, Seed
from mncore.observe import metrics
from mncore.trace import graph_for, rng
from mncore.trace.backward import forget_frames, take_failure
from mncore.trace.guards import value_text
from mncore.trace.record import upload, value_of
from mncore.trace.state import separate_trace
from mncore.trace.tensor import LazyTensor, Storage

KNOWN_OPTIONS = {"float_dtype": config.PRECISION_POLICIES}


class MNDevice:
    """A device string: ``pfvm:cpu``, ``pfvm:cuda[:N]``, ``emu2``, ``mncore2:auto`` or ``mncore2:N``."""

    def __init__(self, spec: str):
        try:
            self.spec: Device = parse(spec)
        except ValueError as e:
            raise ValueError(f"MNDevice: {e}") from None

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"MNDevice({self.spec.name!r})"


def _describe(t: torch.Tensor) -> str:
    return get_tensor_name(t) or f"tensor(shape={tuple(t.shape)}, dtype={t.dtype})"


class TensorProxy:
    """A device-resident value: a compiled function's output, an input slot or a registered tensor."""

    def __init__(self, leaf: Data | None, meta: TensorMeta, context: Context | None = None, name: str | None = None):
        self._leaf_obj = leaf
        self._meta = meta
        self._context = context
        self._name = name

    def _leaf(self) -> Data:
        if self._name is not None:
            return self._context._value(self._name)
        return self._leaf_obj

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._meta.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._meta.dtype

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self._meta.shape)

    def cpu(self) -> torch.Tensor:
        """Wait for the producing job and copy the value to the host."""
        buf = self._leaf().wait()
        metrics.add("bytes_to_host", buf.numel() * buf.element_size())
        return buf.to("cpu", dtype=self._meta.dtype, copy=True)  # 'double' keeps float32 values as float64

    def item(self) -> Any:
        return self.cpu().item()

    def numpy(self) -> Any:
        return self.cpu().numpy()

    def load_from(self, tensor: torch.Tensor, clone: bool = True) -> TensorProxy:
        """Replace the device value with ``tensor`` (always copied: host edits never leak in)."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"load_from expects a torch.Tensor, got {type(tensor).__name__}")
        what = self._name or "input proxy"
        if tuple(tensor.shape) != self._meta.shape or tensor.dtype != self._meta.dtype:
            raise ValueError(f"{what}: expected shape {list(self._meta.shape)} {self._meta.dtype}, "
                             f"got {list(tensor.shape)} {tensor.dtype}")
        leaf = upload(tensor)
        if self._name is not None:
            self._context._values[self._name] = leaf
        else:
            self._leaf_obj = leaf
        return self

    def __repr__(self) -> str:
        return f"TensorProxy(shape={list(self._meta.shape)}, dtype={self._meta.dtype})"


@dataclass(eq=False)
class _Binding:
    kind: str  # 'input' | 'state' | 'const'
    key: Any  # input key, registered name, or the constant Data leaf


@dataclass(eq=False)
class _Variant:
    """One compiled graph of a function: what it binds, what it returns and updates, and its guards
    (``(spec, Guard)``: a spec like an output's, naming where the call finds the guarded value)."""

    exe: Any
    bindings: list[_Binding]
    scalars: list
    out_specs: dict
    state_updates: dict[str, int]
    node_metas: list
    guards: list[tuple]
    codegen_dir: pathlib.Path


class CompiledFunction:
    """Calling it with a dict submits one job and returns a dict of TensorProxy.

    A call is asynchronous unless the function read values on the host while it compiled: then the
    call waits for its guard values (see ``mncore.context.guards``) and, when one changed, reruns the
    call on the variant compiled for the new values, compiling it first if there is none
    (``MNCORE_CONTEXT_VARIANTS`` bounds the variants; past it, ``GuardError``).
    """

    def __init__(self, context: Context, function: Callable, input_specs: dict, options: dict, first: _Variant):
        self._context = context
        self._function = function
        self._options = options
        self.input_specs = input_specs
        self.variants: list[_Variant] = [first]
        self.codegen_dir = first.codegen_dir

    @property
    def output_specs(self) -> dict:
        v = self.variants[0]
        return {k: _spec_meta(v, spec) for k, spec in v.out_specs.items()}

    def allocate_input_proxy(self) -> dict[str, TensorProxy]:
        """Device-side input slots (zero-filled) to fill with ``load_from``."""
        return {k: TensorProxy(Data(m, torch.zeros(m.shape, dtype=m.dtype, device=settings.exec_device)), m)
                for k, m in self.input_specs.items()}

    def _bind_inputs(self, inputs: Any) -> dict[str, Data]:
        if not isinstance(inputs, dict):
            raise TypeError(f"a compiled function takes a dict of tensors, got {type(inputs).__name__}")
        for k in self.input_specs:
            if k not in inputs:
                raise InputError(f"{k} is not in inputs (expected keys: {', '.join(self.input_specs)})")
        extra = [k for k in inputs if k not in self.input_specs]
        if extra:
            raise InputError(f"unexpected input key(s) {', '.join(map(repr, extra))}; "
                             f"the function was compiled for {', '.join(self.input_specs)}")
        leaves = {}
        for k, m in self.input_specs.items():
            v = inputs[k]
            if isinstance(v, TensorProxy):
                got, leaf = v._meta, None
            elif isinstance(v, torch.Tensor):
                got, leaf = meta_of(v), None
            else:
                raise TypeError(f"input {k!r} must be a torch.Tensor or TensorProxy, got {type(v).__name__}")
            if got.shape != m.shape or got.dtype != m.dtype:
                raise ValueError(f"input {k!r}: expected shape {list(m.shape)} {m.dtype}, got {list(got.shape)} {got.dtype}")
            leaves[k] = v._leaf() if isinstance(v, TensorProxy) else (leaf or upload(v))
        return leaves

    def __call__(self, inputs: dict) -> dict[str, TensorProxy]:
        Context.switch_context(self._context)
        bound = self._bind_inputs(inputs)
        if not self.variants[0].guards:
            return self._commit(self.variants[0], bound, self._submit(self.variants[0], bound))
        changed = []
        for v in list(self.variants):
            outs = self._submit(v, bound)
            broken = self._broken_guard(v, bound, outs)
            if broken is None:
                if v is not self.variants[0]:  # the next call tries it first
                    self.variants.remove(v)
                    self.variants.insert(0, v)
                return self._commit(v, bound, outs)
            changed.append(broken)
        limit = config.get("context_variants")
        if len(self.variants) >= limit:
            raise GuardError(
                f"Context function {_name(self._function)}: {changed[0]} changed, and the {len(self.variants)} "
                f"variant(s) compiled so far (MNCORE_CONTEXT_VARIANTS={limit}) were all compiled for other values; "
                "this call did not run. Pass the value as an input and branch on the device (torch.where), "
                "or raise MNCORE_CONTEXT_VARIANTS")
        v = self._context._compile_variant(self._function, bound, self.input_specs, self._options,
                                           self.codegen_dir / f"variant{len(self.variants)}")
        outs = self._submit(v, bound)
        broken = self._broken_guard(v, bound, outs)
        if broken is not None:
            raise GuardError(f"Context function {_name(self._function)}: {broken} differs between the compile-time "
                             "evaluation and the compiled graph on the same inputs (a float read whose last bits "
                             "depend on how the graph is fused?); read it outside the function")
        self.variants.insert(0, v)
        return self._commit(v, bound, outs)

    def _submit(self, v: _Variant, bound: dict[str, Data]) -> list[Data]:
        """Run ``v`` on the bound inputs; its outputs (the state is updated only by ``_commit``)."""
        leaves = [_leaf_of(self._context, b, bound) for b in v.bindings]
        scalars = [_fresh_seed() if isinstance(s, Seed) else s.value for s in v.scalars]
        ready = Latch()  # one per job: the worker sets it when every output exists
        outs = [Data(m, ready=ready) for m in v.node_metas]
        for o in outs:
            o.graph = v.exe.name if v.exe else None
        if v.exe is not None:
            for name, i in v.state_updates.items():  # a failed call keeps the last good value
                outs[i].fallback = self._context._value(name)
            # the fallbacks are set before the job is submitted: the job may run (and drop them on
            # success) inside submit, on this thread; set after, they were never dropped, and every
            # call kept the state values it replaced alive (a chain of fallbacks)
            executor.submit(Job(exe=v.exe, leaves=leaves, scalars=scalars, outs=outs))
        return outs

    def _broken_guard(self, v: _Variant, bound: dict[str, Data], outs: list[Data]) -> str | None:
        """Waits for ``v``'s guard values; describes the first that changed (None: all hold)."""
        for spec, guard in v.guards:
            leaf = outs[spec[1]] if spec[0] == "node" else _leaf_of(self._context, spec[1], bound)
            value = leaf.wait()
            if not guard.holds(value):
                return (f"{guard.describe()} (compiled for {value_text(guard.expected)}, "
                        f"got {value_text(value.to('cpu', dtype=guard.expected.dtype))})")
        return None

    def _commit(self, v: _Variant, bound: dict[str, Data], outs: list[Data]) -> dict[str, TensorProxy]:
        ctx = self._context
        for name, i in v.state_updates.items():
            ctx._values[name] = outs[i]
        result = {}
        for k, spec in v.out_specs.items():
            if spec[0] == "node":
                result[k] = TensorProxy(outs[spec[1]], v.node_metas[spec[1]])
            else:
                result[k] = TensorProxy(_leaf_of(ctx, spec[1], bound), spec[2])
        return result


def _spec_meta(v: _Variant, spec: tuple) -> tuple:
    return v.node_metas[spec[1]] if spec[0] == "node" else spec[2]


def _leaf_of(ctx: Context, b: _Binding, bound: dict[str, Data]) -> Data:
    """The value a binding names at this call."""
    if b.kind == "input":
        return bound[b.key]
    return ctx._value(b.key) if b.kind == "state" else b.key


def _name(function: Callable) -> str:
    return repr(getattr(function, "__qualname__", type(function).__name__))


def _fresh_seed() -> int:
    return rng.next_seed()


class Context:
    """Owns registered tensors' device values; compiles and runs step functions on its device."""

    _current: Context | None = None

    def __init__(self, device: MNDevice):
        if not isinstance(device, MNDevice):
            raise TypeError(f"Context needs an MNDevice, got {type(device).__name__}")
        self.device = device
        self._registry: dict[str, torch.Tensor] = {}
        self._values: dict[str, Data] = {}
        self._optimizers: list = []

    # -- activation -------------------------------------------------------------------------
    @classmethod
    def switch_context(cls, context: Context) -> None:
        """Make ``context`` current: the previous one's device values go back to the host."""
        if cls._current is context:
            return
        prev = cls._current
        if prev is not None:
            prev.synchronize()
            prev._values.clear()
        cls._current = context
        context._activate()

    def _activate(self) -> None:
        import mncore

        want, have = self.device.spec.name, settings.device
        if have == want or (want == "mncore2:auto" and have is not None and have.startswith("mncore2:")):
            return  # already there ('auto' is satisfied by the board this process holds)
        mncore.init(want, implicit_sync=settings.implicit_sync, execution=settings.execution,
                    sim_mode=settings.sim_mode, float_dtype=settings.float_dtype)

    # -- registry ---------------------------------------------------------------------------
    def _register(self, t: torch.Tensor, what: str) -> None:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        name = get_tensor_name(t)
        if name is None:
            raise ValueError(f"cannot register an unnamed {what} (shape {list(t.shape)}); name it first with "
                             "set_tensor_name_in_module(model, 'model') or set_buffer_name_in_optimizer(opt, 'opt')")
        if name in self._registry:
            raise ValueError(f"a tensor named {name!r} is already registered in this context")
        if isinstance(t, LazyTensor):
            raise ValueError(f"{name!r} is an mncore lazy tensor; register host (CPU) tensors with the Context API")
        self._registry[name] = t

    def register_param(self, p: torch.Tensor) -> None:
        self._register(p, "parameter")

    def register_buffer(self, b: torch.Tensor) -> None:
        self._register(b, "buffer")

    def register_optimizer_buffers(self, optimizer: torch.optim.Optimizer) -> None:
        """Register every state tensor of ``optimizer`` (named by ``set_buffer_name_in_optimizer``)."""
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    self._register(v, "optimizer state tensor")
        self._optimizers.append(optimizer)

    def _value(self, name: str) -> Data:
        leaf = self._values.get(name)
        if leaf is None:
            leaf = self._values[name] = upload(self._registry[name])
        return leaf

    def get_registered_value_proxy(self, t: torch.Tensor) -> TensorProxy:
        name = get_tensor_name(t)
        if name is None or self._registry.get(name) is not t:
            raise ValueError(f"tensor {_describe(t)} is not registered in this context")
        return TensorProxy(None, meta_of(t), self, name)

    def synchronize(self) -> None:
        """Wait for all work; write every registered tensor's device value back into its host tensor.

        A call that failed since the last ``synchronize`` raises here, after the write-back: its
        state updates never happened, so the host gets the last good values.
        """
        executor.drain()
        with torch.no_grad():
            for name, leaf in self._values.items():
                host = self._registry[name]
                buf = leaf.wait()
                host.copy_(buf.to(host.device))
                metrics.add("bytes_to_host", buf.numel() * buf.element_size())
        executor.raise_errors()

    def release(self, write_back: bool = True) -> None:
        """Give up this context's device values (after writing them back unless ``write_back=False``)."""
        if write_back:
            self.synchronize()
        self._values.clear()
        if Context._current is self:
            Context._current = None

    # -- compile ----------------------------------------------------------------------------
    def compile(self, function: Callable, inputs: dict, codegen_dir: str | os.PathLike,
                options: dict | None = None, cache_options: CacheOptions | None = None) -> CompiledFunction:
        """Trace ``function`` once on lazy placeholders shaped like ``inputs`` and compile the graph."""
        if not callable(function):
            raise TypeError(f"function must be callable, got {type(function).__name__}")
        options = _validate_options(options)
        if cache_options is not None and not isinstance(cache_options, CacheOptions):
            raise TypeError(f"cache_options must be a CacheOptions, got {type(cache_options).__name__}")
        _check_dict(inputs, "inputs")
        if not isinstance(codegen_dir, (str, os.PathLike)):
            raise TypeError(f"codegen_dir must be a directory path (str or os.PathLike), got "
                            f"{type(codegen_dir).__name__}; e.g. storage.path('/tmp/mncore/step')")
        if pathlib.Path(codegen_dir).is_file():
            raise ValueError(f"codegen_dir {codegen_dir} is a file; give a directory (it will hold manifest.json, "
                             "program.txt and graph.py)")
        Context.switch_context(self)
        self.cache_options = cache_options
        input_specs = {k: meta_of(v) for k, v in inputs.items()}
        placeholders = {k: upload(v) for k, v in inputs.items()}
        first = self._compile_variant(function, placeholders, input_specs, options, pathlib.Path(codegen_dir))
        return CompiledFunction(self, function, input_specs, options, first)

    def _compile_variant(self, function: Callable, placeholders: dict[str, Data], input_specs: dict, options: dict,
                         codegen_dir: pathlib.Path) -> _Variant:
        """Trace ``function`` on ``placeholders`` (the sample, or a call's inputs when a guard changed)."""
        trace = _Trace(self, placeholders, options)
        outs, states, consts = trace.run(function)
        return trace.finish(outs, states, consts, input_specs, options, codegen_dir)


def _validate_options(options: dict | None) -> dict:
    options = dict(options or {})
    for k, v in options.items():
        if k not in KNOWN_OPTIONS:
            raise ValueError(f"unknown compile option {k!r}; known options: {', '.join(KNOWN_OPTIONS)}")
        if v not in KNOWN_OPTIONS[k]:
            raise ValueError(f"option {k}={v!r} is invalid; choose one of {', '.join(KNOWN_OPTIONS[k])}")
    options.setdefault("float_dtype", "float")
    return options


def _check_dict(d: Any, what: str) -> None:
    if not isinstance(d, dict):
        raise TypeError(f"{what} must be a dict[str, Tensor], got {type(d).__name__}")
    for k, v in d.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{what} keys must be non-empty strings, got {k!r}")
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{what}[{k!r}] must be a torch.Tensor, got {type(v).__name__}")


class _Trace:
    """One tracing session: binds registered tensors to lazy twins (``bind.Binder``) and back afterwards.

    Everything that needs the lazy view of the world (output values, registered tensors' final
    values) is read while the twins are still bound; the autograd graph of the outputs is
    dropped before restoring, because saved tensors pin the swapped objects. Host reads are
    answered from the sample and become guards (``guards.GuardRecorder``).
    """

    def __init__(self, context: Context, placeholders: dict[str, Data], options: dict):
        self.ctx = context
        self.placeholders = placeholders
        self.twins: dict[str, LazyTensor] = {}
        self.initial: dict[str, tuple] = {}
        self.reads = GuardRecorder(tuple(sorted(options.items())))
        self.opt_snapshot = [(o, {p: dict(st) for p, st in o.state.items()}) for o in context._optimizers]

    def _twin(self, name: str, host: torch.Tensor) -> LazyTensor:
        leaf = self.ctx._value(name)
        twin = LazyTensor(leaf.meta, Storage((leaf, 0), leaf.meta))
        if host.requires_grad:
            twin.requires_grad_(True)
        if isinstance(host, torch.nn.Parameter):
            twin._is_param = True
        set_tensor_name(twin, name)
        self.initial[name] = twin.mn_storage.value
        return twin

    def run(self, function: Callable) -> tuple[dict, dict, list]:
        """Trace ``function``; returns (output refs+metas, state update refs+metas, frozen constants)."""
        binder = Binder()
        rebinds: RebindWatch | None = None
        failure: BaseException | None = None
        result = None
        scope = contextlib.ExitStack()
        self.consts = scope.enter_context(separate_trace(host_read=self.reads))
        scope.enter_context(config.scoped(implicit_sync="error"))
        try:
            weakly_held = []
            for name, host in self.ctx._registry.items():
                twin = self._twin(name, host)
                if binder.swappable(host):
                    binder.swap(host, twin)
                    self.twins[name] = host  # the host object holds the lazy twin while swapped
                else:
                    weakly_held.append((host, twin))
                    self.twins[name] = twin
            if weakly_held:
                binder.substitute(weakly_held, keep=(self.ctx._registry,))
            del weakly_held
            rebinds = RebindWatch({id(obj): name for name, obj in self.twins.items()})
            rebinds.start()
            result = self._trace(function, rebinds)
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the host tensors are back
            failure = e
            note = "".join(traceback.format_exception(e))
            forget_frames(e)  # their frames pin the swapped tensors (autograd graphs, locals)
            e.add_note(f"traceback of the compile-time failure:\n{note}")
            gc.collect()
        finally:
            if rebinds is not None:
                rebinds.stop()
            errors = binder.restore()
            scope.close()
            if errors:
                raise RuntimeError("Context.compile could not give registered tensors back to the host: "
                                   + "; ".join(errors) + " (is a tensor produced by the function kept alive "
                                   "with its autograd graph?)") from failure
        if failure is not None:
            raise failure
        return result

    def _trace(self, function: Callable, rebinds: RebindWatch) -> tuple[dict, dict, list]:
        lazy_inputs = {k: _placeholder(leaf) for k, leaf in self.placeholders.items()}
        try:
            out = function(lazy_inputs)
        except ImplicitSyncError as e:  # a write into an unregistered host tensor (host reads become guards)
            raise RuntimeError(f"a compiled function runs on the device, and {e}") from None
        except RuntimeError as e:  # an op that failed in backward: autograd reports it as a RuntimeError
            cause = take_failure(e)  # raise the op's own error (a NotCompilableError says the step cannot compile)
            if cause is None:
                raise
            raise cause from None
        rebinds.apply()  # a registered buffer the function replaced: its last value, as a state update
        self._check_optimizers()
        outs = self._outputs(out)
        states = {name: (obj.mn_storage.value, obj.mn_storage.meta) for name, obj in self.twins.items()
                  if obj.mn_storage.value is not self.initial[name]}
        return outs, states, list(self.consts)

    def _check_optimizers(self) -> None:
        for opt, snap in self.opt_snapshot:
            grew = [p for p, st in opt.state.items() if p not in snap or set(st) != set(snap[p])]
            if grew:
                for p in list(opt.state):  # roll back: the lazy state created while tracing is not kept
                    if p in snap:
                        opt.state[p] = snap[p]
                    else:
                        del opt.state[p]
                raise RuntimeError(
                    "the compiled function created new optimizer state; allocate it before compiling "
                    "(use MNCoreSGD/MNCoreAdam/MNCoreAdamW) and register it with register_optimizer_buffers")

    @staticmethod
    def _outputs(out: Any) -> dict[str, tuple]:
        if not isinstance(out, dict):
            raise TypeError(f"the compiled function must return a dict[str, Tensor], got {type(out).__name__}")
        refs = {}
        for k, v in out.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"output keys must be non-empty strings, got {k!r}")
            if not isinstance(v, LazyTensor):
                raise TypeError(f"output {k!r} must be a tensor computed from the inputs or registered tensors, "
                                f"got {type(v).__name__}")
            refs[k] = (value_of(v), v.mn_meta)
        return refs

    def finish(self, outs: dict, states: dict, consts: list, input_specs: dict, options: dict,
               codegen_dir: pathlib.Path) -> CompiledFunction:
        refs: list[tuple] = []
        metas: list[tuple] = []
        out_specs: dict[str, tuple] = {}
        leaf_binding = {id(leaf): _Binding("input", k) for k, leaf in self.placeholders.items()}
        for name, (leaf, _) in self.initial.items():
            leaf_binding[id(leaf)] = _Binding("state", name)

        def add_ref(ref: tuple, meta: tuple) -> int:
            refs.append(ref)
            metas.append(meta)
            return len(refs) - 1

        for k, (ref, meta) in outs.items():
            if type(ref[0]) is Node:
                out_specs[k] = ("node", add_ref(ref, meta))
            else:
                out_specs[k] = ("leaf", leaf_binding.get(id(ref[0]), _Binding("const", ref[0])), meta)
        state_updates = {name: add_ref(ref, meta) for name, (ref, meta) in states.items() if type(ref[0]) is Node}
        guards = [(("node", add_ref(g.ref, g.meta)) if type(g.ref[0]) is Node else
                   ("leaf", leaf_binding.get(id(g.ref[0]), _Binding("const", g.ref[0]))), g) for g in self.reads.guards]
        cache = self.ctx.cache_options
        with disk_cache.using(cache.path if cache else None, read_only=bool(cache and cache.read_only)):
            exe, leaves, scalars = (graph_for(refs, options=tuple(sorted(options.items()))) if refs else (None, [], []))
        bindings = [leaf_binding.get(id(leaf), _Binding("const", leaf)) for leaf in leaves]
        if consts:
            warnings.warn("Context.compile: these tensors are read by the function but are neither inputs nor "
                          "registered, so their current values are frozen into the compiled function: "
                          + ", ".join(dict.fromkeys(consts)), stacklevel=3)
        _write_codegen_dir(codegen_dir, exe, bindings, input_specs, out_specs, metas, state_updates, options, consts,
                           guards)
        return _Variant(exe, bindings, scalars, out_specs, state_updates, metas, guards, codegen_dir)


def _placeholder(leaf: Data) -> LazyTensor:
    return LazyTensor(leaf.meta, Storage((leaf, 0), leaf.meta))


def _spec_json(meta: tuple) -> dict:
    return {"shape": list(meta.shape), "dtype": str(meta.dtype).replace("torch.", "")}


def _write_codegen_dir(path: pathlib.Path, exe: Any, bindings: list, input_specs: dict, out_specs: dict,
                       metas: list, state_updates: dict, options: dict, consts: list, guards: list) -> None:
    """The compiler's manifest with the Context's names for every input and output slot."""
    extra = {"options": options, "frozen_constants": consts, "state_updates": sorted(state_updates),
             "guards": [g.summary() for _, g in guards],
             "input_specs": {k: _spec_json(m) for k, m in input_specs.items()},
             "output_specs": {k: _spec_json(metas[s[1]] if s[0] == "node" else s[2]) for k, s in out_specs.items()}}
    if exe is None:
        codegen.write(path, None, {"graph": None, "device": settings.device, **extra})
        return
    consts_seen = iter(range(len(bindings)))
    input_names = {i: (b.key if b.kind != "const" else f"constant{next(consts_seen)}") for i, b in enumerate(bindings)}
    output_names = {s[1]: k for k, s in out_specs.items() if s[0] == "node"}
    output_names.update({i: f"{name} (updated)" for name, i in state_updates.items()})
    output_names.update({s[1]: f"guard {g.read} at {g.site}" for s, g in guards if s[0] == "node"})
    codegen.write(path, exe, codegen.manifest(exe, settings.device, input_names, output_names, extra),
                  onnx=config.get("codegen_onnx"))
