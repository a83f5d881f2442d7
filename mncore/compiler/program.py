"""The compiled executable: the optimised FX graph, its kernel program, memory plan and modelled cost.

pfvm devices run the graph's generated Python code (PyTorch kernels). The simulated devices run
the kernel program kernel by kernel, applying the precision policy's number formats where the
device would round (``precision``), so their numerics show what ``mixed`` and ``half`` do.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from mncore.compiler.fusion import Kernel
from mncore.compiler.memory_plan import MemoryPlan
from mncore.compiler.precision import round_to_format


class KernelFailed(Exception):
    """Raised by the emulator with the failing node attached (the executor names it)."""

    def __init__(self, node: fx.Node, kernel: int, exc: BaseException):
        super().__init__(f"{exc}")
        self.node, self.kernel, self.exc = node, kernel, exc


@dataclass(eq=False)
class Executable:
    """What the runtime runs. Loaded from the disk cache, the graph and kernels are decoded only
    when something needs them (emulation, error reports, codegen): pfvm and performance-mode
    execution need only the generated ``forward`` and the statistics."""

    name: str
    n_nodes: int
    key: Any
    policy: str = "float"
    plan: MemoryPlan | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    emulate: bool = False
    output_metas: list = field(default_factory=list)
    forward: Callable[..., Any] | None = None  # generated code: forward(self, *args)
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

    def fn(self, *args: Any) -> Any:
        if self.emulate:
            return run_kernels(self, list(args))
        if self.forward is not None:
            return self.forward(None, *args)
        return self.gm(*args)


def _to_double(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
        return x.double()
    if x is torch.float32:
        return torch.float64
    return x


def run_kernels(exe: Executable, args: list) -> tuple:
    """Emulate the device: kernels in order, number formats applied at kernel boundaries."""
    graph = exe.graph
    policy = exe.policy
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for p, a in zip(placeholders, args):
        if policy == "double":
            a = _to_double(a)
        elif policy == "half" and isinstance(a, torch.Tensor):
            a = round_to_format(a, "half")
        env[p] = a
    remaining = {n: len(n.users) for n in graph.nodes}
    load = env.__getitem__
    for k in exe.kernels:
        for node in k.nodes:
            args_ = fx.node.map_arg(node.args, load)
            kwargs = fx.node.map_arg(node.kwargs, load)
            if policy == "double":
                args_ = fx.node.map_aggregate(args_, _to_double)
                kwargs = fx.node.map_aggregate(kwargs, _to_double)
            elif policy in ("mixed", "half") and node.meta.get("mn_class") == "complex":
                args_ = fx.node.map_aggregate(args_, _half_operand)
            try:
                env[node] = node.target(*args_, **kwargs)
            except Exception as e:  # noqa: BLE001 - named by the executor
                raise KernelFailed(node, k.index, e) from e
            for a in node.all_input_nodes:
                remaining[a] -= 1
                if remaining[a] == 0 and a.op != "placeholder":
                    env.pop(a, None)
        if policy == "half":
            for o in k.outputs:
                if isinstance(env.get(o), torch.Tensor):
                    env[o] = round_to_format(env[o], "half")
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    # under 'double' results stay float64 on the device; host reads return the program's dtype
    return tuple(fx.node.map_arg(out_node.args[0], load))


def _half_operand(x: Any) -> Any:
    return round_to_format(x, "half") if isinstance(x, torch.Tensor) else x
