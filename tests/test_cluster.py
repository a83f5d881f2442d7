"""The cluster layer: ``--cluster`` parsing and the resources a cell asks for, and a two-node Ray cluster
on this machine (``tests/cluster_driver.py``, started and stopped inside a loopback-only network
namespace of its own) running tiny model cells: the rows equal ``--cluster local``'s, the shared compile
cache means neither node compiles, a killed worker gives ``node_lost`` while the other cells finish,
Ctrl-C cancels what still runs and keeps the finished rows, and Ray Client (``ray://``) runs the cells
and a fuzz campaign with the results of ``--cluster local``."""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from harness import cells, cli, cluster, netns
from harness.compare import compare
from reports import cluster_plan
from reports.schema import ModelRow
from tests.cluster_driver import FROZEN_MAX_S, LAST, MODELS, VICTIM

FUZZ_FINDING = "aten.sum.dim_IntList:mismatch:lazy_vs_eager"

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "cluster_driver.py"
# A bound for a wedged cluster, far above the run (about a minute on 2 idle cores, three when loaded), and
# below pytest's 600 s per test (pyproject), so that this bound, not the test timeout, ends a wedged run.
DRIVER_TIMEOUT_S = 540

# The figures of a row that depend only on the seed and the code (never on timing or where it ran).
LOSSES = ["eager_losses", "lazy_losses", "context_losses", "lazy_captured_losses"]
COUNTS = ["params", "graphs_per_step", "compiles_after_warmup", "implicit_syncs_per_step", "fallback_ops_per_step",
          "cache_hits", "lazy_captured_status", "lazy_captured_replays_per_step"]


@pytest.mark.parametrize("text, kind, address", [
    ("local", "local", None), ("ray", "ray", None), ("auto", "ray", "auto"),
    ("ray://10.1.2.3:10001", "ray", "ray://10.1.2.3:10001"), ("head.example:6379", "ray", "head.example:6379")])
def test_cluster_choices(text, kind, address, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster.cluster_choice(text) == cluster.ClusterChoice(kind, address)


def test_plain_ray_joins_ray_address(monkeypatch):
    """Ray's own rule: with ``RAY_ADDRESS`` set, ``--cluster ray`` joins that cluster instead of starting one."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert cluster.cluster_choice("ray") == cluster.ClusterChoice("ray", "127.0.0.1:6379")


@pytest.mark.parametrize("text", ["slurm", "ray://nohost", "127.0.0.1"])
def test_bad_cluster_is_refused_at_parse_time(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected local"):
        cluster.cluster_choice(text)
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--tier", "models", "--cluster", text])
    assert e.value.code == 2


def test_ray_missing_is_a_usage_error(monkeypatch, tmp_path, capsys):
    """Without Ray installed, ``--cluster ray`` stops before anything runs or is written, naming the extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(cluster.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    out = tmp_path / "out"
    assert cli.main(["run", "--tier", "models", "--models", "mlp_w64:tiny", "--cluster", "ray", "--out", str(out)]) == 2
    assert "pip install -e '.[ray]'" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray not installed (pip install -e '.[ray]')")
def test_resources_of_a_cell():
    """CPUs for every cell, a GPU for pfvm:cuda, one simulated board (the ``mncore2`` resource) for mncore2."""
    from harness import cluster_ray

    assert cluster_ray.resources("pfvm:cpu") == {"num_cpus": 1, "scheduling_strategy": "SPREAD"}
    assert cluster_ray.resources("pfvm:cuda")["num_gpus"] == 1
    assert cluster_ray.resources("mncore2:auto")["resources"] == {"mncore2": 1}
    assert "resources" not in cluster_ray.resources("emu2:0") and "num_gpus" not in cluster_ray.resources("emu2:0")


def test_loopback_check():
    netns.check_loopback(["127.0.0.1", "127.0.0.2", "::1"])
    with pytest.raises(RuntimeError, match="10.0.0.5"):
        netns.check_loopback(["127.0.0.1", "10.0.0.5"])


def _two_nodes(tmp: Path) -> dict:
    """What ``tests/cluster_driver.py`` saw, run inside its own loopback-only network and PID namespaces
    (which end every Ray process it started)."""
    ray_tmp = tempfile.mkdtemp(prefix="mncore-ray-")  # short: Ray's socket paths must fit in 107 bytes
    try:
        proc = subprocess.run(netns.wrap([sys.executable, str(DRIVER), str(tmp / "result.json"), ray_tmp]), cwd=ROOT,
                              env=cells.child_env(), capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    finally:  # the namespace, and with it every Ray process, ended with the driver
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, f"driver failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    report = json.loads((tmp / "result.json").read_text())
    for key in ("local", "ray"):
        report[key] = {(r["model"], r["config"]): ModelRow.from_json(r, where=key)
                       for r in ({k: v for k, v in r.items() if k in ModelRow.field_names()} for r in report[key])}
    return report


def test_two_node_cluster(tmp_path):
    """One driver run (a cluster costs seconds to start, so every check reads the same run):"""
    why = netns.unavailable() or (None if importlib.util.find_spec("ray") else "Ray not installed: "
                                  "pip install -e '.[ray]' (make install does)")
    if why:
        pytest.skip(f"no two-node Ray cluster here: {why}")
    run = _two_nodes(tmp_path)
    local, on_ray = run["local"], run["ray"]
    keys = [tuple(m.split(":")) for m in MODELS]

    # The cluster stays on loopback (the driver refuses to run cells otherwise).
    assert run["in_namespace"], "the driver must run where only lo exists"
    assert sorted(run["nodes"]) == ["127.0.0.1", "127.0.0.2"]
    netns.check_loopback(run["nodes"])

    # Every deterministic figure of a cell run on Ray equals the local run's (losses by the harness
    # comparison, counts and statuses exactly), and the cells ran on both nodes.
    for key in keys:
        a, b = on_ray[key].to_json(), local[key].to_json()
        assert a["status"] == b["status"] == "pass", (key, a["reason"], b["reason"])
        for name in LOSSES:
            verdict = compare(torch.tensor(a[name]), torch.tensor(b[name]), path=f"{key} {name}")
            assert verdict, verdict.message
        assert {n: a.get(n) for n in COUNTS} == {n: b.get(n) for n in COUNTS}, key
        assert b.get("node") is None
    assert {on_ray[key].node for key in keys} == {"127.0.0.1", "127.0.0.2"}

    # The local run compiled into the shared MNCORE_CACHE_DIR; on Ray both nodes only load from it
    # (``lazy_compile_s`` adds the time of each compile, so it is exactly 0.0 when nothing compiled).
    for key in keys:
        assert local[key].lazy.compile_s > 0, key
        assert on_ray[key].lazy.compile_s == 0.0, (key, on_ray[key].node)

    # Killing the Ray worker that runs a cell gives it node_lost, naming the node; the rest finish.
    assert run.get("killed_worker"), "the driver never saw the victim cell's child"
    victim = on_ray[(VICTIM, "tiny")]
    assert victim.status == "node_lost", (victim.status, victim.reason)
    assert victim.node in run["nodes"] and victim.node in victim.reason

    # SIGINT while the last cell runs cancels it (no cell process left), keeps the three finished rows.
    waited = f" (it waited {FROZEN_MAX_S:.0f} s for the third)" if run.get("third_row_missing") else ""
    assert "running_at_sigint" in run, f"the last cell's child was never seen running with three rows written{waited}"
    assert run["running_at_sigint"] == 1  # only the last cell's child was running
    assert run["ray_rc"] == 130 and run["ray_meta"]["interrupted"] == "SIGINT"
    assert (LAST, "tiny") not in on_ray and len(on_ray) == 3
    assert run["running_after"] == 0

    # Through Ray Client (ray://HEAD:PORT, the head's client server), the same cells end as locally.
    assert run["client_rc"] == run["local_rc"]  # the same exit status (1: the subset is new to the expectations)
    client = {(r["model"], r["config"]): r for r in run["client"]}
    assert {key: client[key]["status"] for key in keys} == {key: local[key].status for key in keys}
    assert {client[key]["node"] for key in keys} <= set(run["nodes"])

    # A fuzz campaign (seed and case budget fixed) on Ray Client, two shards: the same cases, verdicts,
    # signatures and findings as the local campaign, its shards on the cluster's nodes, none lost.
    fuzz_local, fuzz_ray = run["fuzz_local"], run["fuzz_client"]
    assert run["fuzz_local_rc"] == run["fuzz_client_rc"] == 1  # the injected bug is a new finding
    verdicts = [[(r["index"], r["case"], r["status"], r["signature"], r["checks"])
                 for r in sorted(f["rows"], key=lambda r: r["index"])] for f in (fuzz_local, fuzz_ray)]
    assert verdicts[0] == verdicts[1] and len(verdicts[0]) == 6
    found = [{sig: (f["count"], f["first_case"], f["shrunk"]) for sig, f in x["summary"]["failures"].items()}
             for x in (fuzz_local, fuzz_ray)]
    assert found[0] == found[1] and list(found[0]) == [FUZZ_FINDING]
    assert fuzz_ray["findings"] == fuzz_local["findings"] != []
    s = fuzz_ray["summary"]
    assert s["lost"] == [] and s["interrupted"] is None and s["workers"] == 2 and s["cluster"].startswith("ray ray://")
    assert set(s["nodes"]) <= set(run["nodes"]) and s["nodes"]


def test_plan_hands_cells_in_order_to_the_first_free_slot():
    # 2 slots: 3 and 3 start at 0; the 2s start at 3, 3 (ending 5, 5) and 5 (ending 7).
    assert cluster_plan.makespan([3, 3, 2, 2, 2], 2) == 7
    assert cluster_plan.makespan([3, 3, 2, 2, 2], 1) == 12
    assert cluster_plan.makespan([3, 3, 2, 2, 2], 8) == 3


def test_plan_from_a_results_file(tmp_path):
    """Cold: every cell's wall time; warm shared cache: less its lazy compile time; more nodes stop
    helping at the longest cell."""
    rows = [{"model": f"m{i}", "config": "tiny", "backend": "pfvm:cpu", "wall_s": w, "lazy_compile_s": c}
            for i, (w, c) in enumerate([(40.0, 10.0), (10.0, 4.0), (10.0, 4.0), (10.0, 4.0)])]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = cluster_plan.plan(cluster_plan.cells(tmp_path), cpus_per_node=1, overhead_s=1.0, nodes=(1, 2, 4))
    assert list(table["cold_cache_s"]) == [74.0, 41.0, 41.0]
    assert list(table["warm_cache_s"]) == [52.0, 31.0, 31.0]
    assert list(table["bound_by"]) == ["total work", "longest cell", "longest cell"]
    with pytest.raises(ValueError, match="wall_s"):
        (tmp_path / "results.jsonl").write_text(json.dumps({"model": "m", "config": "tiny", "backend": "b"}) + "\n")
        cluster_plan.cells(tmp_path)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray not installed (pip install -e '.[ray]')")
def test_ray_client_server_failure_names_the_fix(monkeypatch):
    """A head whose client server cannot start the client's server process: the error names the fix."""
    from harness import cluster_ray

    def refused(**kwargs):
        raise ConnectionAbortedError("Initialization failure from server: RuntimeError: Starting Ray client server "
                                     "failed. See ray_client_server_23000.err for detailed logs.")

    monkeypatch.setattr(cluster_ray.ray, "init", refused)
    with pytest.raises(cluster.ClusterError, match="GRPC_ENABLE_FORK_SUPPORT=false"):
        with cluster_ray.RayCluster.connect("ray://127.0.0.1:10001", 1):
            pass
    with pytest.raises(cluster.ClusterError) as e:  # joined by GCS address, the hint does not apply
        with cluster_ray.RayCluster.connect("127.0.0.1:6379", 1):
            pass
    assert "GRPC_ENABLE_FORK_SUPPORT" not in str(e.value)
