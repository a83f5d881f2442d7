"""``mncore.config``: every knob of mncore, declared once, and the settings ``mncore.init`` chose.

Each knob is one row of ``KNOBS``: its environment variable, default, allowed values, validator
and the moment it is read. Nothing else in mncore reads the environment; code asks
``config.get(name)``, which applies a scoped ``override`` first, then the environment, then the
default, and names the variable and the allowed values when a value is bad.

``python -m mncore.config`` prints the table as Markdown (docs/configuration.md's copy is checked against it).
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from mncore.errors import ConfigError, DirectoryError

IMPLICIT_SYNC_MODES = ("error", "warn", "silent")
FALLBACK_MODES = ("warn", "error", "silent")
EXECUTION_MODES = ("sync", "async_naive", "async")
SIM_MODES = ("functional", "performance")
BACKWARD_THREADS = ("caller", "device")
CPU_THREADS = ("auto", "caller", "worker")
PRECISION_POLICIES = ("double", "float", "mixed", "half")
DEBUG_FLAGS = ("recompile",)


# Parsers take the raw text and raise ConfigError("must be ...; got ...") without the knob's name,
# which get() and resolve() put in front.

def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"must be one of {', '.join(choices)}; got {raw!r}")
        return raw
    return parse


def _flag(raw: str) -> bool:
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise ConfigError(f"must be 1 or 0; got {raw!r}")


def _number(kind: type, minimum: float, what: str) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        try:
            value = float(raw)
            if kind is int:
                if value != int(value):
                    raise ValueError(raw)
                value = int(value)
        except (ValueError, OverflowError):
            raise ConfigError(f"must be {what}; got {raw!r}") from None
        if value < minimum:
            raise ConfigError(f"must be {what}; got {raw!r}")
        return value
    return parse


def _debug(raw: str) -> frozenset:
    flags = frozenset(f.strip() for f in raw.split(",") if f.strip())
    unknown = flags - set(DEBUG_FLAGS)
    if unknown:
        raise ConfigError(f"must be a comma-separated list of {', '.join(DEBUG_FLAGS)}; "
                          f"unknown: {', '.join(sorted(unknown))}")
    return flags


def _path(raw: str) -> str | None:
    return raw or None


@dataclass(frozen=True)
class Knob:
    """One setting: ``field`` is its name for ``get``/``override``; ``env`` the variable users set."""

    field: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    read: str
    doc: str
    allowed: str = ""


def _knob(field_: str, default: Any, parse: Callable[[str], Any], read: str, doc: str, allowed: str) -> Knob:
    return Knob(field_, "MNCORE_" + field_.upper(), default, parse, read, doc, allowed)


KNOBS: tuple[Knob, ...] = (
    _knob("device", "mncore2:auto", str, "init, and the first use of the device before any init",
          "the device init() attaches when called without one; also attached when a tensor reaches mncore "
          "before any init() (e.g. torch.ones(2).to('mncore') in a program that never imports mncore)",
          "a device string (see init)"),
    _knob("implicit_sync", "warn", _choice(IMPLICIT_SYNC_MODES), "init",
          "what a host read of a pending value does", ", ".join(IMPLICIT_SYNC_MODES)),
    _knob("fallback", "warn", _choice(FALLBACK_MODES), "init",
          "emu2/mncore2: an op with a data-dependent output shape cuts the graph and runs on the host, with a "
          "warning once per call site (warn), silently (silent), or raises StaticShapeError (error)",
          ", ".join(FALLBACK_MODES)),
    _knob("execution", "async", _choice(EXECUTION_MODES), "init",
          "how sync() hands graphs to the worker", ", ".join(EXECUTION_MODES)),
    _knob("backward_thread", "caller", _choice(BACKWARD_THREADS), "init (on the thread that calls it)",
          "where autograd runs backward over mncore tensors: on the thread that calls backward() (caller), or on "
          "PyTorch's per-device autograd thread, its default for accelerators (device), which hands the GIL to and "
          "fro with the tracing thread (benchmarks/backward_thread.py compares the lazy MLP step both ways: slower "
          "on the device thread)", ", ".join(BACKWARD_THREADS)),
    _knob("sim_mode", "functional", _choice(SIM_MODES), "init",
          "emu2/mncore2: compute values, or only model time", ", ".join(SIM_MODES)),
    _knob("float_dtype", "float", _choice(PRECISION_POLICIES), "init",
          "lazy mode's precision policy", ", ".join(PRECISION_POLICIES)),
    _knob("debug", frozenset(), _debug, "init", "debug output (recompile: explain every recompile)",
          "comma-separated: " + ", ".join(DEBUG_FLAGS)),
    _knob("gc_freeze", True, _flag, "init",
          "keep long-lived objects out of Python's full garbage collections: freeze what is alive at init, and "
          "once more (after one full collection) at the first graph a repeating step reuses", "0, 1"),
    _knob("gc_at_sync", True, _flag, "init",
          "from the first graph a repeating step reuses, collect Python's young generations at graph cuts "
          "instead of inside the step (automatic ones then wait for many more allocations)", "0, 1"),
    _knob("capture_check", 100, _number(int, 0, "a non-negative integer"), "each mncore.capture()",
          "captured steps: every N-th call traces again and compares instead of replaying (0: never)",
          "integer >= 0"),
    _knob("context_variants", 8, _number(int, 1, "a positive integer"), "each Context call",
          "Context API: compiled variants per function when host-read guards change (1: a change raises)",
          "integer >= 1"),
    _knob("reinplace", True, _flag, "each graph run on pfvm",
          "pfvm: run a graph as its generated code with fresh intermediates written in place (1), or as the "
          "functional graph, every op making a new tensor (0: the same values, slower; to rule the rewrite out "
          "or to measure it, as benchmarks/reinplace.py does)", "0, 1"),
    _knob("cpu_thread", "auto", _choice(CPU_THREADS), "each graph submitted",
          "pfvm:cpu in sync and async modes: where graphs run: on the thread that submits them (caller), on the "
          "worker thread (worker), or on the caller unless the graph's memory plan peaks above 256 MiB (auto). The "
          "worker overlaps host tracing with the kernels but costs two thread hand-offs per graph, and its "
          "intra-op threads compete with the caller's for the same cores; a large graph ran slower on the caller "
          "(async_naive always uses the worker)", ", ".join(CPU_THREADS)),
    _knob("cache_size", 1024, _number(int, 1, "a positive integer"), "each compile",
          "executables kept in the in-memory LRU", "integer >= 1"),
    _knob("cache_dir", None, _path, "each compile", "persistent compile cache directory (unset: none)", "a directory"),
    _knob("cache_readonly", False, _flag, "each compile",
          "read the disk cache, never write to it", "0, 1"),
    _knob("codegen_dir", None, _path, "each compile", "lazy mode: write one codegen directory per graph here",
          "a directory"),
    _knob("codegen_onnx", False, _flag, "each compile",
          "also export model.onnx into codegen directories (onnx extra)", "0, 1"),
    _knob("sim_boards", 1, _number(int, 1, "a positive integer"), "init",
          "number of simulated MN-Core 2 boards on this host", "integer >= 1"),
    _knob("sim_dram_bytes", None, _number(int, 1, "a positive number of bytes"),
          "each graph cut", "simulated board DRAM (unset: hardware.json's 16 GiB)", "bytes > 0"),
    _knob("sim_costs", None, _path, "each compile", "an edited copy of the cost model's costs.json", "a file"),
    _knob("lock_timeout", 600.0, _number(float, 0.0, "a non-negative number of seconds"),
          "init and each compile", "seconds to wait for a board lock or a cache entry's compile lock",
          "seconds >= 0"),
    _knob("runtime_dir", None, _path, "init", "board lock files (unset: `$TMPDIR/mncore-$UID`)", "a directory"),
    _knob("optest_sample", 0, _number(int, 0, "a non-negative integer"),
          "test collection", "generated op tests: deterministic sample of N rows (0: all)", "integer >= 0"),
    _knob("optest_batch", 64, _number(int, 1, "a positive integer"), "test collection",
          "generated op tests: rows of one op per test item (1: a test per row)", "integer >= 1"),
)
_BY_FIELD = {k.field: k for k in KNOBS}
_BY_ENV = {k.env: k for k in KNOBS}
_overrides: list[dict[str, Any]] = []
_lock = threading.Lock()


def knob(name: str) -> Knob:
    """The knob called ``name`` (field name such as ``cache_dir`` or variable ``MNCORE_CACHE_DIR``)."""
    k = _BY_FIELD.get(name) or _BY_ENV.get(name)
    if k is None:
        raise KeyError(f"mncore.config has no knob {name!r}; known: {', '.join(_BY_FIELD)}")
    return k


def _environ(name: str) -> str | None:
    """``os.environ.get(name)`` without the KeyError it raises and catches for an unset name, nor encoding
    the name again: knobs are read on every upload and graph cut, and most are unset."""
    data = getattr(os.environ, "_data", None)
    if type(data) is not dict:  # not CPython's os._Environ: the public way
        return os.environ.get(name)
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = os.environ.encodekey(name)
    v = data.get(key)
    return None if v is None else os.environ.decodevalue(v)


_ENCODED: dict[str, object] = {}  # variable name -> its key in os.environ's own table


def get(name: str) -> Any:
    """The value in force: the innermost ``override``, else the environment, else the default."""
    k = knob(name)
    for scope in reversed(_overrides):
        if k.field in scope:
            return scope[k.field]
    raw = _environ(k.env)
    if raw is None:
        return k.default
    try:
        return k.parse(raw.strip())
    except ConfigError as e:
        raise ConfigError(f"{k.env} {e}") from None


def resolve(name: str, value: Any) -> Any:
    """An argument that overrides knob ``name`` (``init(sim_mode=...)``), validated; None means ``get``."""
    k = knob(name)
    if value is None:
        return get(name)
    try:
        return k.parse(value) if isinstance(value, str) else value
    except ConfigError as e:
        raise ConfigError(f"{k.field} {e} (the argument, or {k.env})") from None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """``with config.override(cache_dir=path):`` knob values for the block, whatever the environment says."""
    for name in values:
        knob(name)
    with _lock:
        _overrides.append(values)
    try:
        yield
    finally:
        with _lock:
            _overrides.remove(values)


def runtime_dir() -> str:
    return get("runtime_dir") or os.path.join(tempfile.gettempdir(), f"mncore-{os.getuid()}")


def ensure_directory(path: str | os.PathLike, what: str, fix: str) -> Path:
    """``path`` as an existing directory (created if missing); ``DirectoryError`` naming ``what`` it is
    for and ``fix`` when it is a file or cannot be created or written."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DirectoryError(f"mncore: {what} {p} is a file, not a directory; {fix}") from None
    except OSError as e:
        raise DirectoryError(f"mncore: cannot create {what} {p} ({e.strerror}); {fix}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise DirectoryError(f"mncore: {what} {p} is not writable; {fix}")
    return p


@dataclass
class Settings:
    """What ``mncore.init`` chose for this process (read it with ``current()``; ``init`` changes it)."""

    device: str | None = None
    kind: str = "pfvm"  # 'pfvm' | 'emu2' | 'mncore2' | a registered test device's kind
    exec_device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    implicit_sync: str = "warn"
    fallback: str = "warn"
    execution: str = "async"
    backward_thread: str = "caller"
    float_dtype: str = "float"
    sim_mode: str = "functional"
    debug: frozenset = frozenset()
    simulated: bool = False  # emu2/mncore2: kernel program numerics and modelled time
    static_shapes: bool = False  # the device compiles graphs with static shapes only


settings = Settings()


def current() -> Settings:
    """The settings in force (device, kind, execution, sim_mode, float_dtype, ...); do not modify."""
    return settings


@contextlib.contextmanager
def scoped(**fields: Any) -> Iterator[None]:
    """Change ``settings`` fields inside the block and restore them after (the Context API's compile)."""
    saved = {k: getattr(settings, k) for k in fields}
    for k, v in fields.items():
        setattr(settings, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(settings, k, v)


_first_use: list[Callable[[], None]] = []


def on_first_use(attach: Callable[[], None]) -> None:
    """``attach`` (trace/runtime.py: ``init()``) runs when the device is used before any ``init``."""
    _first_use[:] = [attach]


def require_init() -> None:
    """Called before the device is used: attach the default device (knob ``device``) if ``init`` was not called."""
    if settings.device is None:
        if _first_use:
            _first_use[0]()
            return
        from mncore.errors import NotInitializedError

        raise NotInitializedError(
            "mncore is not initialized: call mncore.init(device=...) (or init_cpu()/init_cuda()) "
            "before putting tensors on the 'mncore' device")


def markdown_table() -> str:
    """The knob table as Markdown (docs/configuration.md holds a copy that a test compares with this)."""
    rows = ["| variable | default | allowed | read | what |", "| --- | --- | --- | --- | --- |"]
    for k in KNOBS:
        if k.default is None or k.default == frozenset():
            default = "unset"
        else:
            default = f"`{int(k.default) if isinstance(k.default, bool) else k.default}`"
        rows.append(f"| `{k.env}` | {default} | {k.allowed} | {k.read} | {k.doc} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
