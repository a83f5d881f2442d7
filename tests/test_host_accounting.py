"""Where host time goes: ``metrics.report()`` splits tracing and graph cuts into their parts and counts
Python's garbage collections; ``MNCORE_GC_FREEZE`` keeps long-lived objects out of full collections and
``MNCORE_GC_AT_SYNC`` moves young collections from inside a step to its graph cut."""
from __future__ import annotations

import gc
import subprocess
import sys

import torch

import mncore


def test_sync_parts_lie_inside_sync_time_and_the_report_shows_them():
    mncore.init_cpu(execution="sync")
    mncore.metrics.reset()
    x = torch.randn(8, 8).mncore()
    for _ in range(3):
        x = (x @ x).tanh()
        mncore.sync()
    c = mncore.metrics.counters()
    parts = [c["collect_s"], c["lookup_s"], c["submit_s"]]
    assert all(p > 0 for p in parts) and c["syncs"] == 3
    assert c["cut_nodes"] == 3 * 2  # each cut holds its matmul and its tanh
    assert sum(parts) <= c["sync_s"] + 1e-6  # measured inside each cut's own window (waits excluded)
    assert c["infer_s"] <= c["trace_s"] + 1e-6
    report = mncore.metrics.report()
    for line in ("  sync_s", "    collect_s", "    lookup_s", "    submit_s", "    other", "  gc_s"):
        assert line in report, report


def test_garbage_collections_are_counted():
    enabled = gc.isenabled()
    gc.disable()  # no automatic collection (set off by another thread's allocations) inside the window
    try:
        before = mncore.metrics.counters()
        gc.collect()
        after = mncore.metrics.counters()
    finally:
        if enabled:
            gc.enable()
    assert after["gc_collections"] == before["gc_collections"] + 1 and after["gc_s"] > before["gc_s"]


def test_init_freezes_long_lived_objects_unless_told_not_to():
    code = "import gc, mncore\nmncore.init_cpu()\nprint(gc.get_freeze_count() > 0)\n"
    for value, frozen in (("1", "True"), ("0", "False")):
        env = {"MNCORE_GC_FREEZE": value, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert r.stdout.strip() == frozen, r.stderr


def _run(code: str, **env: str) -> list:
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **env}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])  # noqa: S307 - our own subprocess's printed literal


def test_a_repeating_step_freezes_what_is_alive_once():
    """Step 1 compiles, step 2 compiles again (it accumulates into the new .grad), step 3 reuses a
    graph: that is where the objects alive are frozen, once; later steps freeze nothing more (the
    frozen count only drops as frozen objects are freed)."""
    code = ("import gc, torch, mncore\nmncore.init_cpu()\nm = torch.nn.Linear(4, 4).mncore()\n"
            "rows = []\n"
            "for _ in range(5):\n"
            "    m(torch.ones(2, 4).mncore()).sum().backward(); mncore.sync(); mncore.wait_device_ops()\n"
            "    rows.append((gc.get_freeze_count(), mncore.metrics.counters()['cache_hits']))\n"
            "print(rows)\n")
    rows = _run(code)
    first_reuse = next(i for i, (_, hits) in enumerate(rows) if hits > 0)
    frozen = [n for n, _ in rows]
    assert all(n <= frozen[0] for n in frozen[:first_reuse])  # nothing new frozen before the reuse
    assert frozen[first_reuse] > frozen[first_reuse - 1]
    assert all(n <= frozen[first_reuse] for n in frozen[first_reuse:])


_GC_STEPS = ("import gc, torch, mncore\nmncore.init_cpu(execution='sync')\nm = torch.nn.Linear(4, 4).mncore()\n"
             "before = gc.get_threshold()\nrows = []\n"
             "def steps(n):\n"
             "    for _ in range(n):\n"
             "        m(torch.ones(2, 4).mncore()).sum().backward(); mncore.sync(); mncore.wait_device_ops()\n"
             "        rows.append((gc.get_threshold()[0], mncore.metrics.counters()['cache_hits']))\n"
             "steps(4)\n")


def test_young_collections_wait_for_the_graph_cut_once_a_step_repeats():
    """Before the first reused graph CPython's thresholds hold; from it on, the automatic one is raised
    (so no young collection runs inside forward/backward), and a cut that follows as many net
    allocations as CPython's threshold collects them itself, counted in ``gc_collections``."""
    code = _GC_STEPS + (
        "keep = []\n"
        "c0 = mncore.metrics.counters()['gc_collections']\n"
        "keep.extend([] for _ in range(2 * before[0]))\n"  # survivors: young objects a cut must collect
        "mid = mncore.metrics.counters()['gc_collections']\n"
        "steps(1)\n"
        "print([before, rows, mid - c0, mncore.metrics.counters()['gc_collections'] - mid, gc.get_count()[0]])\n")
    before, rows, inside, at_cut, young_left = _run(code)
    first_reuse = next(i for i, (_, hits) in enumerate(rows) if hits > 0)
    assert all(t == before[0] for t, _ in rows[:first_reuse])
    assert all(t > 10 * before[0] for t, _ in rows[first_reuse:])
    assert inside == 0  # 2x the usual threshold of new objects triggered no collection by itself
    assert at_cut >= 1 and young_left < before[0]


def test_gc_at_sync_off_keeps_cpythons_thresholds_and_init_restores_them():
    code = _GC_STEPS + "print([before, rows])\n"
    before, rows = _run(code, MNCORE_GC_AT_SYNC="0")
    assert all(t == before[0] for t, _ in rows)
    code = _GC_STEPS + "mncore.init_cpu()\nprint([before, list(gc.get_threshold()), rows[-1][0]])\n"
    before, after, raised = _run(code)
    assert raised > before[0] and tuple(after) == tuple(before)
