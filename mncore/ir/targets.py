"""Graph targets the tracer emits besides aten ops: seeded random ops and mutate-and-return ops.

Both are plain callables named by their op, so the disk cache can write them as names and the
FX code generator can print them.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from mncore.ir.ops import OpInfo

aten = torch.ops.aten


def _native_dropout(g: torch.Generator, x: torch.Tensor, p: float, train: bool | None) -> tuple:
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    if p >= 1:
        return torch.zeros_like(x), torch.zeros_like(x, dtype=torch.bool)
    mask = torch.empty_like(x).bernoulli_(1 - p, generator=g).to(torch.bool)
    return x * mask * (1.0 / (1 - p)), mask


def _like(fill: str):
    def run(g: torch.Generator, x: torch.Tensor, *args: Any, dtype=None, layout=None, device=None,
            pin_memory=None, memory_format=None) -> torch.Tensor:
        out = torch.empty_like(x, dtype=dtype, device=device, memory_format=memory_format or torch.preserve_format)
        if fill == "uniform":
            return out.uniform_(generator=g)
        if fill == "normal":
            return out.normal_(generator=g)
        low, high = (0, args[0]) if len(args) == 1 else (args[0], args[1])
        return out.random_(int(low), int(high), generator=g)
    return run


_CUSTOM = {
    aten.native_dropout.default: _native_dropout,
    aten.rand_like.default: _like("uniform"),
    aten.randn_like.default: _like("normal"),
    aten.randint_like.default: _like("int"),
    aten.randint_like.low_dtype: _like("int"),
}


def random_supported(op: Any, has_generator: bool) -> bool:
    """Random ops run with a seeded generator argument, or through a custom seeded implementation."""
    return has_generator or op in _CUSTOM


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    """Where the op runs: its first tensor argument's device, else its ``device=`` argument, else CPU."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (list, tuple)):
            for t in a:
                if isinstance(t, torch.Tensor):
                    return t.device
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else torch.device("cpu")


class Seeded:
    """Graph target that runs a random op with a generator seeded from a lifted input."""

    def __init__(self, fn: Any, op: Any):
        self.fn = fn
        self.op = op
        self.custom = _CUSTOM.get(op)
        self.__name__ = f"seeded_{getattr(fn, '__name__', str(fn))}"

    def __call__(self, seed: int, *args: Any, **kwargs: Any) -> Any:
        g = torch.Generator(device=_device_of(args, kwargs))
        g.manual_seed(int(seed))
        if self.custom is not None:
            return self.custom(g, *args, **kwargs)
        return self.fn(*args, generator=g, **kwargs)

    def __repr__(self) -> str:
        return self.__name__


def _clone(x: Any) -> Any:
    if isinstance(x, list):
        return [None if t is None else t.clone() for t in x]
    return None if x is None else x.clone()


class MutateFn:
    """Graph target for a mutating op without a functional twin: clone, mutate, return new values."""

    def __init__(self, op: Any, info: OpInfo):
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

    def with_op(self, op: Any) -> MutateFn:
        """The same clone-and-mutate target around another kernel (a lowering that replaces the op's own)."""
        twin = copy.copy(self)
        twin.op = op
        twin.__name__ = f"functionalized_{getattr(op, '__name__', 'op')}"
        return twin

    def __repr__(self) -> str:
        return self.__name__
