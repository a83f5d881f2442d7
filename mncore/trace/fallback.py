"""Host fallback on static-shape devices: cut the graph, run the op on the host, continue lazily.

``emu2`` and ``mncore2`` compile graphs whose every shape is fixed in advance, so an op whose output
shape depends on values (``nonzero``, ``unique``, ``masked_select``, ``linalg.lstsq``, ...) cannot be
a node of one. As PyTorch/XLA and TorchNeuron do, such an op cuts the pending graph (its inputs are
read back, an implicit sync), runs with PyTorch's host kernel, and its results are uploaded as
inputs of the next graph. Each one is counted in ``fallback_ops`` (per op in
``metrics.fallback_ops()``) with the bytes it moved; ``init(fallback=)`` / ``MNCORE_FALLBACK``
choose a warning once per call site (``warn``), ``silent``, or ``StaticShapeError`` (``error``).
The pfvm devices run the same ops eagerly on their execution device, silently.
"""
from __future__ import annotations

from typing import Any

import torch

from mncore.config import settings
from mncore.errors import HostFallbackWarning, StaticShapeError
from mncore.ir.values import describe_site
from mncore.observe import metrics
from mncore.trace.sites import user_site, warn_at

_warned: set = set()


def first_line(why: str, op: Any = None) -> str:
    """Why ``op`` cannot be a graph node, in a few words: an op PyTorch tags as having a data-dependent
    output shape says so, PyTorch's usual message for an op without a meta kernel is said plainly, else
    the first line of the message, short enough for a warning."""
    if torch.Tag.dynamic_output_shape in getattr(op, "tags", ()) or "data-dependent" in why or not why.strip():
        return "its output shape depends on values"
    if "no fake impl or Meta kernel" in why:
        return "PyTorch has no shape function (meta kernel) for it"
    line = why.strip().splitlines()[0].replace("aten::", "")
    return line if len(line) <= 160 else line[:157] + "..."


def admit(op_name: str, reason: str) -> None:
    """Apply ``settings.fallback`` before ``op_name`` runs on the host of a static-shape device."""
    mode = settings.fallback
    if mode == "silent":
        return
    site = user_site()
    where = describe_site(site)
    what = (f"mncore: {op_name} at {where} cannot be a node of {settings.device}'s static-shape graphs "
            f"({reason})")
    if mode == "error":
        raise StaticShapeError(
            f"{what}, and init(fallback='error') (or MNCORE_FALLBACK=error) refuses to run it on the host. Use "
            "fallback='warn'|'silent' to cut the graph there and run it on the host, compute it on the host "
            "yourself (.cpu()), or use a pfvm device")
    key = (site, op_name, settings.device)
    if key in _warned:
        return
    _warned.add(key)
    message = (f"{what}: the pending graph is cut here and the op runs on the host (counted in fallback_ops; "
               "shown once per call site; init(fallback='error'|'silent') changes this)")
    warn_at(site, message, HostFallbackWarning)


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size() if x.layout == torch.strided else 0
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    if isinstance(x, dict):
        return sum(_nbytes(y) for y in x.values())
    return 0


def count_transfers(args: Any, out: Any) -> None:
    """The host round trip of one fallback: its inputs read back, its outputs uploaded."""
    metrics.add("bytes_to_host", _nbytes(args))
    metrics.add("bytes_to_device", _nbytes(out))
