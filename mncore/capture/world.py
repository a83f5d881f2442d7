"""What a captured step depends on besides its arguments: the modules and optimizers it uses.

Capture cannot see arbitrary Python state. It finds the ``nn.Module``s and optimizers a step uses
(in the function's globals and closure, a bound method's ``self`` and its attributes, the
arguments, and through module and optimizer hooks while it records) and keys on what changes their
graph: each module's ``training`` flag, whether each parameter has a ``.grad``, grad mode and
autocast. Optimizer hyperparameters that are Python numbers are a guard checked before each replay.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from mncore.trace.tensor import DEVICE_NAME

_PLAIN = (int, float, bool, str, type(None), complex)


class World:
    """The modules, parameters and optimizers a captured function was seen to use (held weakly)."""

    def __init__(self) -> None:
        self._modules: list[weakref.ref] = []
        self._params: list[weakref.ref] = []
        self._optimizers: list[weakref.ref] = []
        self._seen: set[int] = set()

    def discover(self, fn: Callable, leaves: list) -> None:
        """Find modules and optimizers the function reaches without running it."""
        for obj in _reachable(fn, leaves):
            self.add(obj)

    def add(self, obj: Any) -> None:
        if id(obj) in self._seen:
            return
        if isinstance(obj, nn.Module):
            for m in obj.modules():
                if id(m) not in self._seen:
                    self._seen.add(id(m))
                    self._modules.append(weakref.ref(m))
                    for p in m.parameters(recurse=False):
                        self._add_param(p)
        elif isinstance(obj, torch.optim.Optimizer):
            self._seen.add(id(obj))
            self._optimizers.append(weakref.ref(obj))
            for group in obj.param_groups:
                for p in group["params"]:
                    self._add_param(p)

    def _add_param(self, p: torch.Tensor) -> None:
        if id(p) not in self._seen:
            self._seen.add(id(p))
            self._params.append(weakref.ref(p))

    def params(self) -> Iterator[torch.Tensor]:
        for w in self._params:
            p = w()
            if p is not None:
                yield p

    def key(self) -> tuple:
        """The Python state that changes the traced graph: computed before every call."""
        training = tuple([m.training for m in (w() for w in self._modules) if m is not None])
        grads = tuple([p.grad is None for p in self.params()])
        return torch.is_grad_enabled(), _autocast(), training, grads

    def hyperparameters(self) -> tuple:
        """Optimizer hyperparameters held as Python numbers (a tensor ``lr`` is read as a tensor)."""
        out = []
        for w in self._optimizers:
            opt = w()
            if opt is not None:
                for g in opt.param_groups:
                    out.append(tuple(sorted((k, v) for k, v in g.items() if k != "params" and type(v) in _PLAIN)))
        return tuple(out)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """While a step records: every module called and every optimizer stepped joins the world."""
        def on_forward(module: nn.Module, args: Any) -> None:
            self.add(module)

        def on_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            self.add(opt)

        handles = [register_module_forward_pre_hook(on_forward), register_optimizer_step_pre_hook(on_step)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _autocast() -> tuple:
    try:
        return torch.is_autocast_enabled(DEVICE_NAME), torch.is_autocast_enabled("cpu")
    except (RuntimeError, TypeError):  # a torch without per-device autocast queries
        return (torch.is_autocast_enabled(),)


def _reachable(fn: Callable, leaves: list) -> Iterator[Any]:
    """Objects a call of ``fn`` can reach by name: arguments, partial arguments, a bound ``self`` (and
    its attributes), closure cells and the globals its code names. What it reaches through other
    functions is found by the hooks while it records."""
    objs: list[Any] = list(leaves)
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
            with contextlib.suppress(ValueError):  # an empty cell
                objs.append(cell.cell_contents)
    for obj in objs:
        if isinstance(obj, (nn.Module, torch.optim.Optimizer)):
            yield obj
