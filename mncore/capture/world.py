"""What a captured step depends on besides its arguments: the modules, optimizers and parameters it uses.

Capture cannot see arbitrary Python state. It finds the ``nn.Module``s, optimizers and leaf tensors
that require grad which a step reaches by name (the function's globals and closure, a bound
method's ``self`` and the attributes of objects passed in, the arguments) before every call, and
the modules and optimizers it runs through hooks while it records. It keys on what changes their
graph: which objects those are, each module's ``training`` flag, each parameter's ``requires_grad``
and whether it has a ``.grad``, grad mode and autocast. Optimizer hyperparameters that are Python
numbers (or tuples of them) are a guard checked before each replay.

Modules and optimizers are held weakly; tensors never are (``torch.utils.swap_tensors``, which
``load_state_dict`` and ``Module.to`` use on mncore tensors, refuses a tensor with a weak reference).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import numbers
import operator
import threading
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import fx, nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mncore.trace.tensor import DEVICE_NAME, LazyTensor

_PLAIN = (int, float, bool, str, type(None), complex)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)  # a torch without it: ask per device


def plain(v: Any) -> bool:
    """A value capture can key on and compare: a number, string, None, or a tuple or list of them."""
    if type(v) in _PLAIN or isinstance(v, numbers.Number):
        return True
    return type(v) in (tuple, list) and all(plain(x) for x in v)


class World:
    """The modules, optimizers and tensors a captured function was seen to use."""

    def __init__(self) -> None:
        self._modules: list[weakref.ref] = []
        self._optimizers: list[weakref.ref] = []
        self._tensors: list[torch.Tensor] = []
        self._seen: set[int] = set()
        self._thread: int | None = None
        self._reached: list = []  # what params() saw last time, and its answer
        self._params: list[torch.Tensor] = []
        self._hyper: dict[int, tuple] = {}  # id(param group) -> (its values, their key, the group: keeps the
        # id valid, whether it holds a list other than its parameters)

    def roots(self, fn: Callable, leaves: list) -> tuple[int, ...]:
        """Find what the call reaches by name (adding it to the world); their identities key the call,
        so rebinding the global model or optimizer records the step again."""
        found = list(_reachable(fn, leaves))
        for obj in found:
            self.add(obj)
        return tuple(id(obj) for obj in found)

    def add(self, obj: Any) -> None:
        if id(obj) in self._seen:
            return
        if isinstance(obj, fx.GraphModule):  # a compiled graph (mncore's own, run on the worker)
            return
        if isinstance(obj, nn.Module):
            for m in obj.modules():
                if id(m) not in self._seen:
                    self._seen.add(id(m))
                    self._modules.append(weakref.ref(m))
        elif isinstance(obj, torch.optim.Optimizer):
            self._seen.add(id(obj))
            self._optimizers.append(weakref.ref(obj))
        elif isinstance(obj, LazyTensor) and obj.requires_grad and obj.is_leaf:
            self._seen.add(id(obj))
            self._tensors.append(obj)

    def _param_lists(self) -> list:
        """The parameter collections of the world's modules (their ``_parameters`` values, where None
        stands for a parameter set to None) and optimizers (each group's list), then its own tensors;
        a parameter reached twice (a module's and an optimizer's) is in two of them. Collections, not a
        generator: the key reads every parameter before every call, and a comprehension over these is
        cheaper than resuming a generator per parameter."""
        lists: list = [m._parameters.values() for w in self._modules if (m := w()) is not None]
        for w in self._optimizers:
            opt = w()
            if opt is not None:
                lists += [group["params"] for group in opt.param_groups]
        lists.append(self._tensors)
        return lists

    def params(self) -> list[torch.Tensor]:
        """Every parameter of the world's modules and optimizers, and its own tensors, once each (in the
        order first reached). Kept while the collections hold the very same tensors: the key reads this
        list before every call, and building it costs more than checking it."""
        reached = [p for ps in self._param_lists() for p in ps]
        if len(reached) != len(self._reached) or not all(map(operator.is_, reached, self._reached)):
            self._reached = reached
            self._params = list({id(p): p for p in reached if p is not None}.values())
        return self._params

    def key(self) -> tuple:
        """The Python state that changes the traced graph, computed before every call. A parameter's
        state is one small int, ``2 * requires_grad + (.grad is None)``: no tuple per parameter to build,
        hash and compare. Read with subclass torch functions off: ``.grad`` and ``requires_grad`` of an
        mncore tensor otherwise look for a ``__torch_function__`` override first, twice as slow."""
        training = tuple([m.training for w in self._modules if (m := w()) is not None])
        params = self.params()
        with torch._C.DisableTorchFunctionSubclass():
            grads = tuple([2 * p.requires_grad + (p.grad is None) for p in params])
        return torch.is_grad_enabled(), _autocast(), training, grads

    def hyperparameters(self) -> tuple:
        """Optimizer hyperparameters held as Python numbers (a tensor ``lr`` is read as a tensor).

        Checked before every replay: a group whose values are the very objects seen last time (the
        usual case: nothing assigned to it) reuses the last answer instead of formatting every number."""
        out = []
        for w in self._optimizers:
            opt = w()
            if opt is not None:
                for g in opt.param_groups:
                    values = tuple(g.values())
                    seen = self._hyper.get(id(g))
                    if seen is None or seen[3] or len(seen[0]) != len(values) or not all(
                            map(operator.is_, seen[0], values)):
                        # a list other than the parameters may change in place: never taken as unchanged
                        lists = any(type(v) is list and v is not g["params"] for v in values)
                        seen = self._hyper[id(g)] = (values, tuple(sorted(
                            (k, repr(v)) for k, v in g.items() if k != "params" and plain(v))), g, lists)
                    out.append(seen[1])
        return tuple(out)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """While a step records: every module it calls and every optimizer it steps joins the world
        (on the recording thread only: the worker runs compiled graphs as modules too)."""
        self._thread = threading.get_ident()

        def on_forward(module: nn.Module, args: Any) -> None:
            if threading.get_ident() == self._thread:
                self.add(module)

        def on_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if threading.get_ident() == self._thread:
                self.add(opt)

        handles = [register_module_forward_pre_hook(on_forward), register_optimizer_step_pre_hook(on_step)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _autocast() -> tuple:
    """Which devices autocast and to what; ``()`` when it is off everywhere (the usual case, one call)."""
    if not _any_autocast():
        return ()
    try:
        return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in (DEVICE_NAME, "cpu"))
    except (RuntimeError, TypeError, AttributeError):  # a torch without per-device autocast queries
        return (torch.is_autocast_enabled(),)


def _reachable(fn: Callable, leaves: list) -> Iterator[Any]:
    """Objects a call of ``fn`` reaches by name: arguments (and the attributes of objects passed),
    partial arguments, a bound ``self`` (and its attributes), closure cells and the globals its code
    names. What it reaches through other functions is found by the hooks while it records."""
    objs: list[Any] = []
    for x in leaves:  # tensor arguments are the call's own (their .grad is bound by position)
        if isinstance(x, torch.Tensor):
            continue
        objs.append(x)
        if not isinstance(x, nn.Module) and hasattr(x, "__dict__") and not inspect.isroutine(x):
            objs += list(vars(x).values())
    f: Any = fn
    while isinstance(f, functools.partial):
        objs += list(f.args) + list(f.keywords.values())
        f = f.func
    if inspect.ismethod(f):
        objs.append(f.__self__)
        objs += list(getattr(f.__self__, "__dict__", {}).values())
        f = f.__func__
    if isinstance(f, nn.Module):
        objs.append(f)
        f = type(f).forward
    code = getattr(f, "__code__", None)
    if code is not None:
        env = getattr(f, "__globals__", {})
        objs += [env[n] for n in code.co_names if n in env]
        for cell in getattr(f, "__closure__", None) or ():
            try:  # (not contextlib.suppress: one object per cell, before every call)
                objs.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
    seen: set[int] = set()
    for obj in objs:
        if id(obj) not in seen and (isinstance(obj, (nn.Module, torch.optim.Optimizer))
                                    or (isinstance(obj, LazyTensor) and obj.requires_grad and obj.is_leaf)):
            seen.add(id(obj))
            yield obj
