"""Where the isolated cells run: ``--cluster local`` (child processes of this one, ``--jobs`` at a
time, the default) or a Ray cluster (``harness.cluster_ray``, imported only when asked for, so Ray
stays an optional extra).

``--cluster ray`` starts an embedded Ray cluster on this machine for the run (``--jobs`` CPUs) or,
when ``RAY_ADDRESS`` is set, joins that one (Ray's own rule); ``--cluster auto`` joins the cluster a
``ray start`` runs on this machine; ``--cluster ray://HOST:PORT`` (Ray Client) and
``--cluster HOST:PORT`` (a cluster's GCS address, from a node of it) join an existing cluster.
Every cluster turns jobs into ``Outcome``s in completion order; ``CellRunner`` does the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence

from harness import interrupt
from harness.argtypes import UsageError
from harness.cells import Job, Outcome, Running, end, start, stop

CHOICES = "local | ray | auto | ray://HOST:PORT | HOST:PORT"
_ADDRESS = re.compile(r"^(ray://)?[\w.\-\[\]:]+:\d+$")
POLL_S = 0.05  # how often the local cluster looks at its children


class Cluster(Protocol):
    """Runs jobs, each in its own child process with ``timeout`` seconds, yielding ``(index, outcome)``
    as each ends; closing the iterator early (an exception, ``Interrupted``) ends every child."""

    def outcomes(self, jobs: Sequence[Job], timeout: float) -> Iterator[tuple[int, Outcome]]: ...


@dataclass(frozen=True)
class ClusterChoice:
    """A parsed ``--cluster``: ``kind`` is ``local`` or ``ray``; ``address`` None starts an embedded
    cluster (unless ``RAY_ADDRESS`` is set), else it is what ``ray.init(address=...)`` joins."""

    kind: str
    address: str | None = None

    @property
    def label(self) -> str:
        if self.kind == "local":
            return "local"
        return f"ray {self.address}" if self.address else "ray (embedded)"


def cluster_choice(text: str) -> ClusterChoice:
    """The ``--cluster`` argument type: a bad value stops at parse time naming the accepted forms."""
    value = text.strip()
    if value in ("local", ""):
        return ClusterChoice("local")
    if value == "ray":
        return ClusterChoice("ray", os.environ.get("RAY_ADDRESS") or None)
    if value == "auto" or _ADDRESS.match(value):
        return ClusterChoice("ray", value)
    raise argparse.ArgumentTypeError(f"{text!r}: expected {CHOICES}")


def add_argument(p: argparse.ArgumentParser) -> None:
    """The ``--cluster`` option of the commands that run cells."""
    p.add_argument("--cluster", type=cluster_choice, default=ClusterChoice("local"), metavar="WHERE",
                   help=f"where the cells run: {CHOICES} (default local: child processes here; ray: an embedded "
                        "Ray cluster with --jobs CPUs, or RAY_ADDRESS when set; see docs/cluster.md)")


class ClusterError(UsageError):
    """The cluster asked for cannot be used (Ray not installed, no cluster at the address)."""


def check(choice: ClusterChoice) -> None:
    """Refuse a Ray cluster when Ray is not installed (or, for ``ray://``, Ray Client's grpcio), before
    anything runs or is written."""
    if choice.kind == "ray" and importlib.util.find_spec("ray") is None:
        raise ClusterError(f"--cluster {choice.label}: Ray is not installed; install the extra with "
                           "pip install -e '.[ray]'")
    if choice.kind == "ray" and is_client(choice.address) and importlib.util.find_spec("grpc") is None:
        raise ClusterError(f"--cluster {choice.label}: Ray Client (ray://) needs grpcio, which plain Ray does not "
                           "install; install the extra with pip install -e '.[ray]' (it has ray[client])")


def is_client(address: str | None) -> bool:
    """Whether ``address`` joins through Ray Client (``ray://HOST:PORT``)."""
    return bool(address and address.startswith("ray://"))


@contextlib.contextmanager
def connect(choice: ClusterChoice, jobs: int = 1) -> Iterator[Cluster]:
    """The cluster of ``choice`` for the block (a Ray one is joined or started here and left after);
    ``ClusterError`` when it cannot be had."""
    if choice.kind == "local":
        yield LocalCluster(jobs)
        return
    check(choice)
    from harness import cluster_ray

    with cluster_ray.RayCluster.connect(choice.address, jobs) as where:
        yield where


class LocalCluster:
    """Child processes of this process, ``jobs`` at a time, each killed at its timeout."""

    def __init__(self, jobs: int = 1, fork: Any = None):
        self.jobs, self.fork = max(1, jobs), fork

    def outcomes(self, jobs: Sequence[Job], timeout: float) -> Iterator[tuple[int, Outcome]]:
        queue = list(enumerate(jobs))
        running: dict[int, Running] = {}
        try:
            while queue or running:
                while queue and len(running) < self.jobs:
                    i, job = queue.pop(0)
                    running[i] = start(job, fork=self.fork)
                for i, r in list(running.items()):
                    timed_out = time.monotonic() - r.t0 >= timeout
                    if r.proc.poll() is None and not timed_out:
                        continue
                    del running[i]
                    yield i, end(r, timed_out and r.proc.poll() is None, timeout)
                time.sleep(POLL_S)
                interrupt.check()
        finally:
            stop(list(running.values()))
