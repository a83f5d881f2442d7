"""The codegen directory: a JSON manifest of what was compiled, the readable program and the graph.

Context API: ``Context.compile(..., codegen_dir)``. Lazy mode: one directory per graph under
``MNCORE_CODEGEN_DIR`` when it is set. Files larger than ``ZSTD_THRESHOLD`` bytes are written
zstd-compressed (``.zst``); ``mncore-dump DIR`` prints the manifest. With the ``onnx`` extra
installed and ``MNCORE_CODEGEN_ONNX=1``, ``model.onnx`` of the graph is exported too. The callers pass
those settings in: this module reads none.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
import pathlib
from typing import Any

import torch
import torch.fx as fx
import zstandard

from mncore._version import __version__
from mncore.config import ensure_directory
from mncore.compile.executable import Executable

ZSTD_THRESHOLD = 1 << 20
MANIFEST = "manifest.json"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _io(node: fx.Node, label: str, where: dict[str, str], dirty: bool) -> dict[str, Any]:
    meta = node.meta["mn"][0]
    return {"name": label, "node": node.name, "shape": list(meta.shape), "dtype": _dtype_name(meta.dtype),
            "layout": {"kind": "RowMajor", "strides": list(meta.stride)}, "dram": where.get(node.name),
            "dirty": dirty}


def manifest(exe: Executable, device: str | None, input_names: dict[int, str] | None = None,
             output_names: dict[int, str] | None = None, extra: dict | None = None) -> dict[str, Any]:
    """Everything a user needs to see what the compiler made of a graph, as plain JSON data."""
    graph = exe.graph
    where = {p.name: f"DRAM@{p.start}-{p.end}" for p in exe.plan.placements} if exe.plan else {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and n.meta["mn"][0] is not None]
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    input_names, output_names = input_names or {}, output_names or {}
    m = {
        "graph": exe.name,
        "key": exe.name.removeprefix("graph_"),
        "device": device,
        "precision_policy": exe.policy,
        "versions": {"mncore": __version__, "compiler": exe.stats.get("compiler_version"),
                     "torch": exe.stats.get("torch")},
        "inputs": [_io(n, input_names.get(i, n.name), where, False) for i, n in enumerate(placeholders)],
        "outputs": [_io(n, output_names.get(i, f"out{i}"), where, True) for i, n in enumerate(out_node.args[0])],
        "stats": {k: v for k, v in exe.stats.items()},
        "kernels": [k.describe() for k in exe.kernels],
        "memory_plan": exe.plan.describe() if exe.plan else None,
    }
    m.update(extra or {})
    return m


def program_text(exe: Executable) -> str:
    """The kernel program, one block per kernel, each op with its output shapes."""
    lines = [f"# {exe.name}: {len(exe.kernels)} kernels, {exe.stats.get('flops', 0):,} FLOPs, "
             f"{exe.stats.get('bytes', 0):,} bytes, modelled {exe.modelled_s * 1e6:.1f} us ({exe.policy})"]
    for k in exe.kernels:
        lines.append(f"kernel {k.index} [{k.kind}, {k.fmt}] {k.flops:,} FLOPs {k.bytes:,} B "
                     f"{k.time_s * 1e6:.2f} us {k.bound}-bound; inputs: {', '.join(n.name for n in k.inputs)}")
        for n in k.nodes:
            shapes = ", ".join(f"{_dtype_name(m.dtype)}{list(m.shape)}" for m in n.meta["mn"] if m is not None)
            args = fx.node.map_arg(n.args, lambda a: f"%{a.name}")
            lines.append(f"  %{n.name} = {getattr(n.target, '__name__', n.target)}{tuple(args)} -> {shapes}")
        lines.append(f"  outputs: {', '.join(n.name for n in k.outputs)}")
    return "\n".join(lines) + "\n"


def _write(path: pathlib.Path, name: str, text: str) -> None:
    data = text.encode()
    stale = path / (name + ".zst") if len(data) <= ZSTD_THRESHOLD else path / name
    stale.unlink(missing_ok=True)
    if len(data) > ZSTD_THRESHOLD:
        (path / (name + ".zst")).write_bytes(zstandard.ZstdCompressor(level=9).compress(data))
    else:
        (path / name).write_bytes(data)


def _example_inputs(exe: Executable) -> tuple:
    args = []
    for n in exe.graph.nodes:
        if n.op == "placeholder":
            m = n.meta["mn"][0]
            args.append(torch.zeros(m.shape, dtype=m.dtype) if m is not None else 0.0)
    return tuple(args)


def write_onnx(path: pathlib.Path, exe: Executable, enabled: bool) -> dict[str, Any]:
    """``model.onnx`` of the graph when ``MNCORE_CODEGEN_ONNX=1`` and the ``onnx`` extra is installed
    (best effort: PyTorch's ONNX
    exporter has no translation for some training ops, e.g. foreach optimizer updates; the reason is
    recorded in the manifest instead)."""
    if not enabled:
        return {"written": False, "reason": "not requested (set MNCORE_CODEGEN_ONNX=1; an export takes seconds)"}
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return {"written": False, "reason": "the onnx extra is not installed (pip install 'mncore[onnx]')"}
    (path / "model.onnx").unlink(missing_ok=True)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(exe.gm, _example_inputs(exe), dynamo=True, verbose=False)
        program.save(str(path / "model.onnx"))
    except Exception as e:  # noqa: BLE001 - the export is optional; say why it is missing
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return {"written": False, "reason": f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]}
    return {"written": True, "file": "model.onnx"}


def write(path: str | os.PathLike, exe: Executable | None, man: dict[str, Any], onnx: bool = False) -> pathlib.Path:
    """Write manifest, program listing, FX code (``graph.py``: the functional graph; ``run.py``: the code pfvm
    runs, intermediates written in place) and (with the onnx extra) ``model.onnx`` of ``exe``."""
    path = ensure_directory(path, "the codegen directory", "give a directory path (codegen_dir / MNCORE_CODEGEN_DIR)")
    if exe is not None:
        _write(path, "program.txt", program_text(exe))
        _write(path, "graph.py", exe.gm.code)
        _write(path, "run.py", exe.code)
        man = {**man, "onnx": write_onnx(path, exe, onnx)}
    (path / MANIFEST).write_text(json.dumps(man, indent=2, default=str))
    return path


def write_lazy(root: str | os.PathLike, exe: Executable, device: str | None, onnx: bool) -> None:
    """Lazy mode: the graph's directory under ``root`` (``MNCORE_CODEGEN_DIR``)."""
    write(pathlib.Path(root) / exe.name, exe, manifest(exe, device), onnx)


def read_text(path: pathlib.Path, name: str) -> str:
    """A codegen file, transparently decompressing ``.zst``."""
    if (path / name).exists():
        return (path / name).read_text()
    return zstandard.ZstdDecompressor().decompress((path / (name + ".zst")).read_bytes()).decode()
