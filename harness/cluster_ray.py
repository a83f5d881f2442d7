"""The cells on a Ray cluster: one Ray task per cell, which starts the cell's child process on its
node (the same ``harness.cells`` start, timeout and kill rules as a local run) and sends back how it
ended with the result file and log, so the driver writes the same results files as a local run.

A task first yields its node's address, and starts the cell only once the driver has it, then yields
the outcome (a streaming generator), so that a worker or node lost mid-cell still names where the cell
was: that cell gets a ``node_lost`` outcome and the others go on. Tasks are never retried (``max_retries=0``: a flaky cell must show), outcomes are
collected with ``ray.wait`` in completion order, and closing the iterator (Ctrl-C) cancels every task
still pending or running (its worker is killed, and with it the child, ``PR_SET_PDEATHSIG``).
Each task asks for ``CPUS_PER_CELL`` CPUs, a GPU for ``pfvm:cuda``, and one ``mncore2`` resource for
a simulated board (``mncore2:*``), so that two cells never share a board on any node.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import ray
from ray import ObjectRefGenerator
from ray.exceptions import RayError, RayTaskError
from ray.util.client import ray as client_ray

from harness.cells import Job, Outcome, end, start, stop
from harness.cluster import ClusterError, is_client
from harness.interrupt import Interrupted, check

T = TypeVar("T")

CPUS_PER_CELL = 1
BOARD = "mncore2"  # the custom resource of one simulated board
FORWARDED = ("MNCORE_", "HF_", "TRANSFORMERS_", "TORCH_", "OMP_NUM_THREADS")  # the driver's settings cells run with
LOG_BYTES = 4 << 20  # at most this much of a cell's log comes back (its tail)
WAIT_S = 0.5  # ray.wait's timeout: how often a stop (Ctrl-C) is seen at the latest
GRACE_S = 120.0  # a node silent this long past a cell's timeout counts as lost
CLIENT_SERVER_HINT = (
    "\n(the head's Ray Client server could not start this client's server process: if the head's "
    "logs/ray_client_server.err shows a gRPC 'Check failed' after fork, start the head with "
    "GRPC_ENABLE_FORK_SUPPORT=false in its environment: docs/cluster.md)")


def resources(device: str | None) -> dict[str, Any]:
    """The ``.options()`` of a cell on ``device``: its CPUs, a GPU, a simulated board; cells are spread
    over the nodes (each is heavy: packing them on one node first would only queue them there)."""
    opts: dict[str, Any] = {"num_cpus": CPUS_PER_CELL, "scheduling_strategy": "SPREAD"}
    if device and device.startswith("pfvm:cuda"):
        opts["num_gpus"] = 1
    if device and device.startswith("mncore2"):
        opts["resources"] = {BOARD: 1}
    return opts


def _tail(path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - LOG_BYTES))
            return f.read()
    except OSError:
        return b""


@ray.remote(max_retries=0, _generator_backpressure_num_objects=1)
def _cell(job: Job, timeout: float, env: dict[str, str]) -> Iterator[Any]:
    """Runs on a node: yield the node's address, then the cell's outcome with its result and log. With
    a backpressure of one item the task waits after yielding until the driver has taken the address,
    so the child never starts before the driver knows its node: a worker killed at once (the two-node
    test kills it as soon as the child runs) was otherwise reported from "an unknown node"."""
    yield ray.util.get_node_ip_address()
    yield _run(job, timeout, env)


@ray.remote(max_retries=0)
def _cell_once(job: Job, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """``_cell`` for Ray Client (``ray://``), which has no streaming generators: the outcome only, so a
    cell lost there cannot name its node."""
    return _run(job, timeout, env)


def _run(job: Job, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """The cell's child on this node, to its end: how it ended, its result file and its log."""
    r = start(job, env)
    try:
        try:
            r.proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        o = end(r, timed_out, timeout)
    except BaseException:  # cancelled (KeyboardInterrupt in the task): the child must not outlive it
        stop([r])
        raise
    result = job.result.read_bytes() if o.kind == "result" else None
    return {"kind": o.kind, "returncode": o.returncode, "wall_s": o.wall_s, "reason": o.reason, "result": result,
            "log": _tail(job.log), "node": ray.util.get_node_ip_address()}


def _signalled(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``call(...)``, with an exception that a signal handler raised inside Ray's C++ (``Interrupted``
    on Ctrl-C, which Ray wraps in a ``SystemError``) raised as itself."""
    try:
        return call(*args, **kwargs)
    except SystemError as e:
        if isinstance(e.__cause__, Interrupted):
            raise e.__cause__ from None
        raise


def _embedded_boards() -> int:
    from mncore import config

    return int(config.get("sim_boards"))


class RayCluster:
    """The joined (or embedded) Ray cluster of the run."""

    @classmethod
    @contextlib.contextmanager
    def connect(cls, address: str | None, jobs: int) -> Iterator[RayCluster]:
        """Join the cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``) or, with None,
        start an embedded one here with ``jobs`` CPUs and this host's simulated boards; left after."""
        if ray.is_initialized():
            raise ClusterError("--cluster: Ray is already initialised in this process (the run connects by itself): "
                               "call ray.shutdown() first")
        quiet = {"logging_level": logging.WARNING, "log_to_driver": False}
        try:
            if address is None:
                ray.init(num_cpus=jobs, resources={BOARD: _embedded_boards()}, include_dashboard=False, **quiet)
            else:
                ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"join the Ray cluster at {address}" if address else "start an embedded Ray cluster"
            hint = CLIENT_SERVER_HINT if is_client(address) and "client server failed" in str(e) else ""
            raise ClusterError(f"--cluster: could not {where}: {e}{hint}") from None
        try:
            yield cls()
        finally:
            ray.shutdown()

    def outcomes(self, jobs: Sequence[Job], timeout: float) -> Iterator[tuple[int, Outcome]]:
        env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}
        task = _cell_once if client_ray.is_connected() else _cell
        total = ray.cluster_resources()
        pending: dict[Any, int] = {}
        node: dict[int, str] = {}
        t0: dict[int, float] = {}
        try:
            for i, job in enumerate(jobs):
                opts = resources(job.device)
                need = {"CPU": opts["num_cpus"], "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})}
                lacking = [k for k, v in need.items() if v and total.get(k, 0) < v]
                if lacking:  # no node could ever take it: say so instead of waiting forever
                    yield i, Outcome(job, "crash", None, 0.0, f"the Ray cluster has no {' or '.join(lacking)} "
                                     f"resource for a cell on {job.device} (start a node with it: docs/cluster.md)")
                    continue
                pending[task.options(**opts).remote(job, timeout, env)] = i
                t0[i] = time.monotonic()
            while pending:
                ready, _ = _signalled(ray.wait, list(pending), num_returns=1, timeout=WAIT_S)
                check()
                for gen in ready:
                    i = pending.pop(gen)
                    got = self._next(gen, jobs[i], node.get(i), t0[i])
                    if isinstance(got, str):  # the address: the cell is starting there
                        node[i], t0[i] = got, time.monotonic()
                        pending[gen] = i
                    else:
                        yield i, got
                for gen, i in list(pending.items()):
                    if i in node and time.monotonic() - t0[i] > timeout + GRACE_S:
                        del pending[gen]
                        ray.cancel(gen, force=True)
                        yield i, Outcome(jobs[i], "node_lost", None, time.monotonic() - t0[i],
                                         f"node {node[i]} sent nothing for {timeout + GRACE_S:g}s", node[i])
        finally:
            for gen in pending:
                ray.cancel(gen, force=True)

    @staticmethod
    def _next(gen: Any, job: Job, where: str | None, t0: float) -> str | Outcome:
        """The task's next item (``gen``: its generator, or its one result under Ray Client): its node's
        address, or its outcome (a lost worker or node included)."""
        try:
            item = _signalled(ray.get, next(gen) if isinstance(gen, ObjectRefGenerator) else gen)
        except RayTaskError as e:  # the task's own code raised (not the cell's child)
            return Outcome(job, "crash", None, time.monotonic() - t0, f"the Ray task failed: {str(e)[-400:]}",
                           where or "")
        except (RayError, StopIteration) as e:
            at = where or "an unknown node (lost before the cell named it, or under Ray Client)"
            return Outcome(job, "node_lost", None, time.monotonic() - t0,
                           f"the Ray worker or node {at} died during the cell ({type(e).__name__})",
                           where or "")
        if isinstance(item, str):
            return item
        if item["result"] is not None:
            job.result.parent.mkdir(parents=True, exist_ok=True)
            job.result.write_bytes(item["result"])
        job.log.parent.mkdir(parents=True, exist_ok=True)
        job.log.write_bytes(item["log"])
        return Outcome(job, item["kind"], item["returncode"], item["wall_s"], item["reason"], item["node"])
