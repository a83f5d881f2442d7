"""A command in network and PID namespaces of its own, with only the loopback interface up: where the
cluster tests and benchmarks run Ray, which may listen on and talk to loopback addresses only (outside
such a namespace Ray binds the machine's interface address whatever ``--node-ip-address`` says). The
PID namespace ends every process the command started (Ray's nodes included) when the command ends.
"""
from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import socket
from typing import Iterable, Sequence


def unavailable() -> str | None:
    """Why no such namespace can be made here (None when it can): it needs root and ``unshare``."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (unshare -n); run as root, as CI does"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) not installed"
    return None


def wrap(argv: Sequence[str]) -> list[str]:
    """``argv`` run inside fresh network, PID and mount namespaces (a private /proc), after ``lo`` is up."""
    return ["unshare", "--net", "--pid", "--fork", "--mount", "--mount-proc", "sh", "-c",
            "ip link set lo up && exec " + shlex.join(argv)]


def inside() -> bool:
    """Whether this process sees only the loopback interface (it runs in such a namespace)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def check_loopback(addresses: Iterable[str]) -> None:
    """``RuntimeError`` naming any address that is not a loopback one."""
    bad = sorted(a for a in addresses if not ipaddress.ip_address(a).is_loopback)
    if bad:
        raise RuntimeError(f"Ray nodes on non-loopback addresses {bad}: the cluster must stay on loopback")
