"""``executable_for``: the in-memory LRU, then the disk cache, then the compiler on a miss.

One path for lazy ``sync()`` and the Context API: the key is built (and hashed) once per graph
cut; the FX graph is built only when the executable has to be compiled.
"""
from __future__ import annotations

from mncore import config
from mncore.cache import disk
from mncore.cache.lru import LRUCache
from mncore.compile import codegen, lowering, pipeline
from mncore.compile.executable import Executable
from mncore.devices.base import Device
from mncore.graph import Collected, GraphKey, graph_key, stable_name
from mncore.graph import fx_build
from mncore.graph.explain import note_compile
from mncore.observe import metrics, timeline

memory = LRUCache()


def key_for(g: Collected, device: Device, options: tuple, policy: str) -> GraphKey:
    return graph_key(g, (device.kind, device.exec_device.type, options, policy, lowering.version()))


def _compile(g: Collected, key: GraphKey, name: str, device: Device, policy: str, explain: bool) -> Executable:
    t0 = timeline.now()
    note_compile(name, g, key, explain)
    fx_graph = fx_build.build(g, device.exec_device)
    exe = pipeline.compile_graph(fx_graph, name, key, policy, static_shapes=device.static_shapes)
    t1 = timeline.now()
    exe.stats["compile_s"] = t1 - t0
    timeline.record("compile", f"compile {name}", t0, t1, nodes=len(g.order), kernels=exe.stats["kernels"])
    metrics.add("compiles")
    metrics.add("compile_s", t1 - t0)
    return exe


def executable_for(g: Collected, device: Device, options: tuple, policy: str,
                   explain: bool = False) -> tuple[Executable, bool]:
    """The executable of graph ``g`` on ``device`` (compiled, loaded from disk, or cached in memory),
    and whether the in-memory cache already held it."""
    key = key_for(g, device, options, policy)
    exe = memory.get(key)
    if exe is not None:
        metrics.add("cache_hits")
        return exe, True
    name = stable_name(g, key)
    exe = disk.get_or_compile(name, policy, key, device, lambda: _compile(g, key, name, device, policy, explain))
    memory.put(key, exe)
    root = config.get("codegen_dir")
    if root:
        codegen.write_lazy(root, exe, device.name, config.get("codegen_onnx"))
    return exe, False
