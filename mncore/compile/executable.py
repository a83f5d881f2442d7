"""The compiled executable: the optimised FX graph, its kernel program, memory plan and modelled cost.

Data only: devices decide how to run it (pfvm calls the generated Python code; emu2 walks the
kernel program with MN-Core number formats).
"""
from __future__ import annotations

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
        """The generated code as a callable ``f(*args)`` (placeholders in order)."""
        if self.forward is not None:
            forward = self.forward
            return lambda *args: forward(None, *args)
        return self.gm
