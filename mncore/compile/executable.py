"""The compiled executable: the optimised FX graph, its kernel program, memory plan and modelled cost.

Data only: devices decide how to run it (pfvm calls the generated Python code; emu2 walks the
kernel program with MN-Core number formats).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from mncore.compile.fusion import Kernel
from mncore.compile.memory_plan import MemoryPlan
from mncore.ir.meta import TensorMeta


@dataclass(eq=False)
class Executable:
    """What the runtime runs. Loaded from the disk cache, the graph and kernels are decoded only
    when something needs them (emulation, error reports, codegen): pfvm and performance-mode
    execution need only the generated ``forward`` and the statistics.

    ``graph`` is functional (what the compiler analyses and the emulator walks); ``forward`` and its
    source ``code`` are that graph with intermediates re-used in place (``compile/reinplace.py``),
    which is what pfvm runs: the same values, without a new tensor for every intermediate."""

    name: str
    n_nodes: int
    key: Any
    policy: str = "float"
    plan: MemoryPlan | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    output_metas: list[TensorMeta] = field(default_factory=list)
    forward: Callable[..., Any] | None = None  # generated code: forward(self, *args)
    code: str = ""  # forward's Python source
    loader: Callable[[], tuple[fx.Graph, list[Kernel]]] | None = None
    _graph: fx.Graph | None = None
    _kernels: list[Kernel] | None = None
    _gm: fx.GraphModule | None = None
    _bound: Callable[..., Any] | None = None

    @classmethod
    def from_graph_module(cls, gm: fx.GraphModule, kernels: list[Kernel], **kw: Any) -> Executable:
        return cls(_graph=gm.graph, _kernels=kernels, _gm=gm, **kw)

    def _load(self) -> None:
        if self._graph is None:
            self._graph, self._kernels = self.loader()

    @property
    def graph(self) -> fx.Graph:
        self._load()
        return self._graph

    @property
    def kernels(self) -> list[Kernel]:
        self._load()
        return self._kernels

    @property
    def gm(self) -> fx.GraphModule:
        if self._gm is None:
            self._gm = fx.GraphModule(torch.nn.Module(), self.graph)
        return self._gm

    @property
    def modelled_s(self) -> float:
        """Modelled device time of one job (kernels + launch overhead), transfers excluded."""
        return self.stats.get("modelled_s", 0.0)

    @property
    def loaded(self) -> bool:
        """Whether the graph and kernels are decoded (a disk-cache load defers them)."""
        return self._graph is not None

    def python_code(self) -> Callable[..., Any]:
        """The generated code as a callable ``f(*args)`` (placeholders in order), its ops bound directly
        (:func:`bind_ops`)."""
        if self._bound is None:
            if self.forward is None:
                return self.gm
            forward = bind_ops(self.code, self.forward.__globals__, self.name)
            self._bound = lambda *args: forward(None, *args)
        return self._bound


_OP_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\.(\w+)\(")


def bind_ops(code: str, env: dict[str, Any], name: str) -> Callable[..., Any]:
    """FX's ``forward`` source with every ``torch.ops.<ns>.<op>.<overload>(...)`` call made through a global
    bound to the overload's C++ dispatcher entry, compiled with ``env``'s globals.

    Why: the generated code looks up four attributes and enters ``OpOverload.__call__`` (a Python frame)
    per op, about 0.6 us; a small graph such as the seed MLP's training step (62 ops) ran 12 % faster on
    pfvm:cpu. The entry is the one ``OpOverload.__call__`` reaches for tensors with no Python dispatch
    (the graph's are plain device tensors), so the values are the same. Anything else (not an
    ``OpOverload``, a name already used in the code) is left as FX wrote it."""
    bound: dict[str, Any] = {}

    def bind(m: re.Match) -> str:
        ns, op, overload = m.groups()
        global_name = f"__mn_{ns}_{op}_{overload}"
        if global_name not in bound:
            try:
                target = getattr(getattr(getattr(torch.ops, ns), op), overload)
            except (AttributeError, RuntimeError):
                return m.group(0)
            entry = getattr(target, "_cpp_dispatch_handle", None) or getattr(target, "_op", None)
            if not isinstance(target, torch._ops.OpOverload) or entry is None or global_name in code:
                return m.group(0)
            bound[global_name] = entry
        return global_name + "("

    source = _OP_CALL.sub(bind, code)
    scope = {**env, **bound}
    exec(compile(source, f"<mncore {name}>", "exec"), scope)  # noqa: S102 - FX's code for our own graph
    return scope["forward"]
