"""The persistent compile cache behind the in-memory LRU (MLSDK's multi-level cache).

Entries live in ``MNCORE_CACHE_DIR`` (lazy mode) or the Context API's ``CacheOptions(path)``, one
file per graph, named by the graph's content hash, device kind, precision policy, compiler
version (with a hash of the compiler's sources and cost constants) and torch version. A file is ``MAGIC``, the SHA-256 of its payload and the payload (a
zstd-compressed pickle of the executable in plain data), written to a temporary file and renamed
into place, so readers never see half an entry. A per-entry lock file makes concurrent processes
that need the same graph compile it once. A checksum mismatch or an unreadable payload is
warned about, counted (``disk_cache_corrupt``), recompiled and replaced. ``MNCORE_CACHE_READONLY=1``
(or ``CacheOptions(..., read_only=True)``) reads a shared cache without ever writing to it.
"""
from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import filelock
import torch
import torch.fx as fx
import zstandard

from mncore import config
from mncore.cache import serialize
from mncore.compile import lowering
from mncore.compile.executable import Executable
from mncore.compile.fingerprint import compiler_version
from mncore.compile.fusion import Kernel
from mncore.devices.base import Device
from mncore.errors import CacheCorruptWarning, CacheLockTimeout, DirectoryError
from mncore.observe import metrics
from mncore.sim.cost import costs_path

MAGIC = b"MNCORE-CACHE-1\n"


def using(path: str | os.PathLike | None, read_only: bool = False) -> contextlib.AbstractContextManager:
    """Use ``path`` as the cache directory inside the block (the Context API's ``CacheOptions``);
    None keeps whatever ``MNCORE_CACHE_DIR`` says."""
    if path is None:
        return contextlib.nullcontext()
    return config.override(cache_dir=str(path), cache_readonly=read_only)


def _location() -> tuple[Path, bool] | None:
    directory = config.get("cache_dir")
    if not directory:
        return None
    return Path(directory), config.get("cache_readonly")


def entry_path(directory: Path, name: str, kind: str, policy: str) -> Path:
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"  # entries hold marshalled bytecode
    version = compiler_version(costs_path())
    return directory / f"{name}-{kind}-{policy}-c{version}-torch{torch.__version__}-{py}.mnx"


def _encode(exe: Executable) -> bytes:
    nodes = list(exe.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    kernels = [(k.index, k.anchor, [index[n] for n in k.nodes], [index[n] for n in k.inputs],
                [index[n] for n in k.outputs], k.flops, k.bytes, k.fmt, k.time_s, k.bound) for k in exe.kernels]
    code = marshal.dumps(compile(exe.code, f"<mncore {exe.name}>", "exec"))
    payload = {"name": exe.name, "policy": exe.policy, "graph": serialize.encode_graph(exe.graph),
               "kernels": kernels, "plan": exe.plan, "stats": exe.stats, "output_metas": exe.output_metas,
               "n_nodes": exe.n_nodes, "code": code, "source": exe.code,
               "globals": serialize.encode_globals(exe.forward.__globals__)}
    return zstandard.ZstdCompressor(level=3).compress(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


def _decode(data: bytes, key: Any, device: Device) -> Executable:
    """Everything but the graph is decoded now; the graph and kernels only when first needed."""
    p = pickle.loads(zstandard.ZstdDecompressor().decompress(data))
    g = serialize.decode_globals(p["globals"])
    exec(marshal.loads(p["code"]), g)  # noqa: S102 - our own generated code, checksummed

    def load() -> tuple[fx.Graph, list[Kernel]]:
        graph = serialize.decode_graph(p["graph"])
        nodes = list(graph.nodes)
        kernels = [Kernel(index=i, anchor=a, nodes=[nodes[j] for j in ns], inputs=[nodes[j] for j in ins],
                          outputs=[nodes[j] for j in outs], flops=f, bytes=b, fmt=fmt, time_s=t, bound=bound)
                   for i, a, ns, ins, outs, f, b, fmt, t, bound in p["kernels"]]
        return graph, kernels

    exe = Executable(name=p["name"], n_nodes=p["n_nodes"], key=key, policy=p["policy"], plan=p["plan"],
                     stats=p["stats"], output_metas=p["output_metas"], forward=g["forward"], code=p["source"],
                     loader=load)
    if device.needs_graph(exe):
        exe._load()  # e.g. the emulator walks the graph on every job: decode it once, here
    return exe


def _read(path: Path, key: Any, device: Device) -> Executable | None:
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # no entry (or no directory) yet
        return None
    digest_end = len(MAGIC) + 64
    try:
        if not raw.startswith(MAGIC):
            raise ValueError("not an mncore cache entry (bad header)")
        digest, data = raw[len(MAGIC):digest_end].decode(), raw[digest_end:]
        if hashlib.sha256(data).hexdigest() != digest:
            raise ValueError("checksum mismatch (truncated or corrupted)")
        return _decode(data, key, device)
    except Exception as e:  # noqa: BLE001 - any damage means: do not trust, recompile
        metrics.add("disk_cache_corrupt")
        warnings.warn(f"mncore: corrupt compile cache entry {path}: {e}; recompiling it", CacheCorruptWarning,
                      stacklevel=2)
        return None


def _write(path: Path, exe: Executable) -> None:
    data = _encode(exe)
    blob = MAGIC + hashlib.sha256(data).hexdigest().encode() + data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600 files; a shared cache must be readable by others
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _stat(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def get_or_compile(name: str, policy: str, key: Any, device: Device,
                   compile_fn: Callable[[], Executable]) -> Executable:
    """The cached executable for this graph, or ``compile_fn()``'s result stored for other processes."""
    loc = _location()
    if loc is None or lowering.has_overrides():
        return compile_fn()
    directory, read_only = loc
    if directory.exists() and not directory.is_dir():
        raise DirectoryError(f"mncore: the compile cache directory {directory} (MNCORE_CACHE_DIR or "
                             "CacheOptions(path)) is a file; point it at a directory")
    path = entry_path(directory, name, device.kind, policy)
    seen = _stat(path)
    exe = _read(path, key, device)
    if exe is not None:
        metrics.add("disk_cache_hits")
        return exe
    metrics.add("disk_cache_misses")
    if read_only:
        return compile_fn()
    config.ensure_directory(directory, "the compile cache directory (MNCORE_CACHE_DIR or CacheOptions(path))",
                            "make it writable, or read a shared cache without writing to it with "
                            "MNCORE_CACHE_READONLY=1 or CacheOptions(path, read_only=True)")
    lock = filelock.FileLock(str(path) + ".lock")
    timeout = config.get("lock_timeout")
    try:
        with lock.acquire(timeout=timeout):
            if _stat(path) not in (None, seen):  # another process wrote it while we waited
                exe = _read(path, key, device)
                if exe is not None:
                    metrics.add("disk_cache_hits")
                    return exe
            exe = compile_fn()
            try:
                _write(path, exe)
            except serialize.NotSerializable:
                pass
            return exe
    except filelock.Timeout:
        raise CacheLockTimeout(f"mncore: timed out after {timeout:g} s (MNCORE_LOCK_TIMEOUT) waiting for the compile "
                               f"lock {lock.lock_file}; another process is compiling {name}") from None
