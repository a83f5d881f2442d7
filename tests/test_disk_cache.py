"""The persistent compile cache (``MNCORE_CACHE_DIR`` in lazy mode, ``CacheOptions(path)`` in the Context API).

Across processes: ``tests/sim_programs/cache_prog.py`` trains a small MLP lazily (SGD with momentum,
3 steps: two distinct graphs) and through the Context API (one graph) on ``emu2`` and prints its metrics
and results. Two copies start at once and meet at a barrier before each part, so they need each graph at
the same moment: across both, every graph is compiled exactly once. A third process then finds every
graph on disk (compiles == 0). Every process's losses equal eager PyTorch's.

In process (``pfvm:cpu``; the memory LRU is cleared so that each run goes to the disk): corrupt entries
are warned about, recompiled and replaced; read-only caches are never written; the compile lock times out
with a clear error; entries are separated by precision policy; override-lowered graphs are not cached.
"""
from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import filelock
import pytest
from conftest import SIM_ENV_VARS
import torch
import torch.nn.functional as F

import mncore
from mncore.cache import disk as disk_cache
from mncore.compile import lowering
from mncore.errors import CacheCorruptWarning, CacheLockTimeout
from mncore.context import CacheOptions, Context, MNDevice, storage
from mncore.cache import memory as compile_cache

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "sim_programs" / "cache_prog.py"
RTOL, ATOL = 1e-5, 1e-6  # float32 vs eager float32: only summation order may differ
COUNTERS = ("compiles", "disk_cache_hits", "disk_cache_misses", "disk_cache_corrupt")


@pytest.fixture
def env(sim_env):
    return sim_env


# ---------------------------------------------------------------------------------------------
# across processes


def _eager_reference() -> tuple[list[float], list[torch.Tensor]]:
    """cache_prog.py's model and data, trained eagerly (SGD momentum 0.9, lr 0.1, 3 steps)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    batches = [(torch.randn(4, 8), torch.randint(0, 4, (4,))) for _ in range(3)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def _start(tmp_path: Path, tag: str, **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in SIM_ENV_VARS and not k.startswith("PYTEST_")}
    env.update(HF_HUB_OFFLINE="1", MNCORE_RUNTIME_DIR=str(tmp_path / "runtime"),
               MNCORE_CACHE_DIR=str(tmp_path / "lazy_cache"), **extra)
    return subprocess.Popen([sys.executable, str(PROGRAM), str(tmp_path / f"codegen_{tag}"),
                             str(tmp_path / "ctx_cache")], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen) -> dict:
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _in_this_process(env, tmp_path: Path) -> dict:
    """The same program in the test process (a third process, which compiled nothing; its LRU is cleared)."""
    spec = importlib.util.spec_from_file_location("cache_prog", PROGRAM)
    prog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prog)
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "lazy_cache"))
    return prog.run(str(tmp_path / "codegen_c"), str(tmp_path / "ctx_cache"))


def test_processes_share_the_disk_cache(env, tmp_path):
    barrier = {"CACHE_PROG_BARRIER": str(tmp_path / "barrier"), "CACHE_PROG_BARRIER_N": "2"}
    first = [_start(tmp_path, "a", **barrier), _start(tmp_path, "b", **barrier)]
    a, b = (_result(p) for p in first)
    c = _in_this_process(env, tmp_path)
    ref_losses, ref_params = _eager_reference()
    for part, n_expected in (("lazy", 2), ("context", 1)):
        graphs = a[part]["graphs"]
        assert len(graphs) == n_expected, graphs
        assert b[part]["graphs"] == c[part]["graphs"] == graphs, "graph names differ between processes"
        # two processes at once: each graph compiled exactly once between them
        ma, mb = a[part]["metrics"], b[part]["metrics"]
        assert ma["compiles"] + mb["compiles"] == len(graphs), (part, ma, mb)
        for m in (ma, mb):
            assert m["compiles"] + m["disk_cache_hits"] == len(graphs), (part, m)
            assert m["disk_cache_corrupt"] == 0
        # a later process (this one): every graph from disk
        mc = c[part]["metrics"]
        assert mc["compiles"] == 0 and mc["disk_cache_hits"] == len(graphs), (part, mc)
        assert mc["disk_cache_misses"] == 0 and mc["disk_cache_corrupt"] == 0, (part, mc)
        # the same numbers in every process (the same graph, the same kernels), and eager's
        for other in (b, c):
            assert other[part]["losses"] == a[part]["losses"], part
            assert other[part]["params"] == a[part]["params"], part
        torch.testing.assert_close(torch.tensor(a[part]["losses"]), torch.tensor(ref_losses), rtol=RTOL, atol=ATOL)
        for got, exp in zip(a[part]["params"], ref_params):
            torch.testing.assert_close(torch.tensor(got), exp, rtol=RTOL, atol=ATOL)
    lazy_entries = sorted(p.name.split("-")[0] for p in (tmp_path / "lazy_cache").glob("*.mnx"))
    ctx_entries = sorted(p.name.split("-")[0] for p in (tmp_path / "ctx_cache").glob("*.mnx"))
    assert lazy_entries == a["lazy"]["graphs"] and ctx_entries == a["context"]["graphs"]
    leftovers = [p.name for d in ("lazy_cache", "ctx_cache") for p in (tmp_path / d).iterdir()
                 if p.suffix not in (".mnx", ".lock")]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------
# in process


X, W = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)), torch.randn(5, 3)
EXPECTED = (X @ W).relu().sum(0)


def _run() -> tuple[torch.Tensor, dict]:
    """One lazy graph, compiled from scratch as far as this process's memory LRU goes."""
    compile_cache.clear()
    before = mncore.metrics.counters()
    out = (X.mncore() @ W.mncore()).relu().sum(0)
    mncore.sync()
    value = out.cpu()
    after = mncore.metrics.counters()
    return value, {k: after[k] - before[k] for k in COUNTERS}


def _snapshot(d: Path) -> dict:
    if not d.exists():
        return {}
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


def _entry(d: Path) -> Path:
    (entry,) = d.glob("*.mnx")
    return entry


def _damage(entry: Path, how: str) -> None:
    raw = entry.read_bytes()
    if how == "flip":
        b = bytearray(raw)
        for i in range(len(b) - 40, len(b) - 8, 3):
            b[i] ^= 0xA5
        entry.write_bytes(bytes(b))
    elif how == "truncate":
        entry.write_bytes(raw[: len(raw) // 2])
    elif how == "header":
        entry.write_bytes(b"garbage" + raw[7:])
    elif how == "empty":
        entry.write_bytes(b"")
    else:
        raise AssertionError(how)


def test_first_run_writes_an_entry_that_the_next_run_loads(env, tmp_path):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    out, m = _run()
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m == {"compiles": 1, "disk_cache_hits": 0, "disk_cache_misses": 1, "disk_cache_corrupt": 0}
    entry = _entry(tmp_path / "cache")
    assert entry.name.startswith("graph_") and "-pfvm-float-" in entry.name and torch.__version__ in entry.name
    out2, m2 = _run()
    torch.testing.assert_close(out2, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m2 == {"compiles": 0, "disk_cache_hits": 1, "disk_cache_misses": 0, "disk_cache_corrupt": 0}


def test_graphs_with_built_in_substitutes_are_cached_and_loaded(env, tmp_path):
    """A training step whose graph runs mncore's checked embedding gradient and fused Adam on dense copies
    (substitutes made per op, closures) used to be compiled in every process: it could not be written. Its
    entry is written once and loaded by the next run, which computes eager's values."""
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    idx = torch.tensor([1, 2, 2, 7])

    def train(device: str) -> tuple[torch.Tensor, dict]:
        compile_cache.clear()
        before = mncore.metrics.counters()
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4).to(device)
        opt = torch.optim.Adam(emb.parameters(), lr=0.1, fused=True)
        emb(idx.to(device)).pow(2).sum().backward()
        opt.step()
        mncore.sync()
        after = mncore.metrics.counters()
        return emb.weight.detach().cpu(), {k: after[k] - before[k] for k in COUNTERS}

    want = train("cpu")[0]
    first, m = train("mncore")
    torch.testing.assert_close(first, want, rtol=RTOL, atol=ATOL)
    assert m["disk_cache_misses"] >= 1 and m["disk_cache_hits"] == 0
    assert len(list((tmp_path / "cache").glob("*.mnx"))) == m["disk_cache_misses"]
    second, m2 = train("mncore")
    torch.testing.assert_close(second, want, rtol=RTOL, atol=ATOL)
    assert m2["compiles"] == m2["disk_cache_misses"] == m2["disk_cache_corrupt"] == 0
    assert m2["disk_cache_hits"] == m["disk_cache_misses"]


@pytest.mark.parametrize("how", ["flip", "truncate", "header", "empty"])
def test_corrupt_entry_is_warned_recompiled_and_replaced(env, tmp_path, how):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    _run()
    entry = _entry(tmp_path / "cache")
    _damage(entry, how)
    damaged = entry.read_bytes()
    with pytest.warns(CacheCorruptWarning, match=entry.name.replace("+", r"\+")):
        out, m = _run()
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m["compiles"] == 1 and m["disk_cache_hits"] == 0 and m["disk_cache_corrupt"] >= 1, m
    assert entry.read_bytes() != damaged, "the damaged entry was not replaced"
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheCorruptWarning)
        out, m = _run()
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m == {"compiles": 0, "disk_cache_hits": 1, "disk_cache_misses": 0, "disk_cache_corrupt": 0}


def test_corrupt_entry_is_counted_and_warned_once(env, tmp_path):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    _run()
    _damage(_entry(tmp_path / "cache"), "flip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, m = _run()
    corrupt = [w for w in caught if issubclass(w.category, CacheCorruptWarning)]
    assert m["disk_cache_corrupt"] == 1 and len(corrupt) == 1, (m, [str(w.message) for w in corrupt])


def test_read_only_cache_is_never_written(env, tmp_path):
    cache = tmp_path / "cache"
    env.setenv("MNCORE_CACHE_DIR", str(cache))
    env.setenv("MNCORE_CACHE_READONLY", "1")
    for _ in range(2):  # empty: compiled every time, nothing created
        out, m = _run()
        torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
        assert m == {"compiles": 1, "disk_cache_hits": 0, "disk_cache_misses": 1, "disk_cache_corrupt": 0}
    assert not cache.exists()
    env.setenv("MNCORE_CACHE_READONLY", "0")  # populate it
    _run()
    env.setenv("MNCORE_CACHE_READONLY", "1")
    before = _snapshot(cache)
    out, m = _run()
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m == {"compiles": 0, "disk_cache_hits": 1, "disk_cache_misses": 0, "disk_cache_corrupt": 0}
    assert _snapshot(cache) == before
    _damage(_entry(cache), "truncate")  # corrupt + read-only: warned and recompiled, but left alone
    before = _snapshot(cache)
    with pytest.warns(CacheCorruptWarning):
        out, m = _run()
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m["compiles"] == 1 and m["disk_cache_hits"] == 0, m
    assert _snapshot(cache) == before


def _context_compile(tmp_path: Path, cache: Path, read_only: bool) -> tuple[torch.Tensor, dict]:
    compile_cache.clear()
    context = Context(MNDevice("pfvm:cpu"))
    Context.switch_context(context)
    before = mncore.metrics.counters()

    def fn(d: dict) -> dict:
        return {"out": (d["x"] @ d["w"]).relu().sum(0)}

    compiled = context.compile(fn, {"x": X, "w": W}, storage.path(tmp_path / "codegen"),
                               cache_options=CacheOptions(cache, read_only=read_only))
    out = compiled({"x": X, "w": W})["out"].cpu()
    after = mncore.metrics.counters()
    return out, {k: after[k] - before[k] for k in COUNTERS}


def test_context_cache_options_read_only(env, tmp_path):
    cache = tmp_path / "ctx_cache"
    out, m = _context_compile(tmp_path, cache, read_only=True)
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m["compiles"] == 1 and not cache.exists()
    out, m = _context_compile(tmp_path, cache, read_only=False)
    assert m["compiles"] == 1 and len(list(cache.glob("*.mnx"))) == 1
    before = _snapshot(cache)
    out, m = _context_compile(tmp_path, cache, read_only=True)
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m == {"compiles": 0, "disk_cache_hits": 1, "disk_cache_misses": 0, "disk_cache_corrupt": 0}
    assert _snapshot(cache) == before
    # the lazy environment variable is not what the Context API uses
    assert "MNCORE_CACHE_DIR" not in os.environ and mncore.config.get("cache_dir") is None


def test_compile_lock_timeout_names_the_graph(env, tmp_path):
    cache = tmp_path / "cache"
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "probe"))
    _run()
    name = _entry(tmp_path / "probe").name
    cache.mkdir()
    held = filelock.FileLock(str(cache / name) + ".lock")  # another compiler of the same graph
    held.acquire()
    try:
        env.setenv("MNCORE_CACHE_DIR", str(cache))
        env.setenv("MNCORE_LOCK_TIMEOUT", "0.2")
        compile_cache.clear()
        out = (X.mncore() @ W.mncore()).relu().sum(0)
        with pytest.raises(CacheLockTimeout, match=name.split("-")[0]) as e:
            mncore.sync()
        assert "MNCORE_LOCK_TIMEOUT" in str(e.value)
        del out
    finally:
        held.release()


def test_entries_are_separate_per_precision_policy(env, tmp_path):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    _run()
    mncore.init("pfvm:cpu", float_dtype="half")
    compile_cache.clear()
    before = mncore.metrics.counters()
    out = (X.mncore() @ W.mncore()).relu().sum(0)
    mncore.sync()
    torch.testing.assert_close(out.cpu(), EXPECTED, rtol=RTOL, atol=ATOL)
    (exe,) = compile_cache.values()
    assert exe.policy == "half" and mncore.metrics.counters()["compiles"] == before["compiles"] + 1
    names = sorted(p.name for p in (tmp_path / "cache").glob("*.mnx"))
    assert len(names) == 2 and any("-float-" in n for n in names) and any("-half-" in n for n in names)


def test_graphs_under_a_lowering_override_are_not_cached(env, tmp_path):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    lowering.register_lowering(torch.ops.aten.relu.default, lambda x: torch.clamp(x, min=0))
    try:
        out, m = _run()
    finally:
        lowering.unregister_lowering(torch.ops.aten.relu.default)
    torch.testing.assert_close(out, EXPECTED, rtol=RTOL, atol=ATOL)
    assert m["compiles"] == 1 and m["disk_cache_misses"] == 0 and m["disk_cache_hits"] == 0
    assert not list((tmp_path / "cache").glob("*.mnx")) if (tmp_path / "cache").exists() else True


def test_entries_are_readable_by_other_users_of_a_shared_cache(env, tmp_path):
    env.setenv("MNCORE_CACHE_DIR", str(tmp_path / "cache"))
    old = os.umask(0o022)
    try:
        _run()
    finally:
        os.umask(old)
    mode = stat.S_IMODE(_entry(tmp_path / "cache").stat().st_mode)
    assert mode & 0o044 == 0o044, oct(mode)
