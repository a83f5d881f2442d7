"""View chains: how a view reads its value from the base, and how a write goes back to it.

A view is stored as a chain of single-output view ops applied to its storage's base value;
writing through it scatters the new value back op by op (slice -> slice_scatter, ...), which is
the functionalization rule PyTorch itself uses.
"""
from __future__ import annotations

from typing import Any

import torch

from mncore.ir.ops import LAZY_BIT_VIEWS

aten = torch.ops.aten

RESHAPES = {aten.view.default, aten._reshape_alias.default, aten.unsqueeze.default, aten.squeeze.default,
            aten.squeeze.dim, aten.squeeze.dims, aten._unsafe_view.default}
PERMUTES = {aten.t.default, aten.transpose.int, aten.permute.default}
ALIASES = {aten.alias.default, aten.detach.default, aten.lift_fresh.default}
SCATTERS = {
    aten.slice.Tensor: aten.slice_scatter.default,
    aten.select.int: aten.select_scatter.default,
    aten.diagonal.default: aten.diagonal_scatter.default,
    aten.as_strided.default: aten.as_strided_scatter.default,
}
SUPPORTED = RESHAPES | PERMUTES | ALIASES | set(SCATTERS) | {aten.expand.default}


def out_of_place(op: Any) -> Any:
    """The view op an in-place metadata op (tagged ``inplace_view``: ``transpose_``, ``squeeze_.dim``,
    ``as_strided_``...) applies to its tensor: the overload of the name without ``_`` whose arguments match."""
    schema = op._schema
    packet = getattr(aten, schema.name.split("::")[1].rstrip("_"))
    want = [(a.name, str(a.type)) for a in schema.arguments[1:]]
    for name in packet.overloads():
        cand = getattr(packet, name)
        if [(a.name, str(a.type)) for a in cand._schema.arguments[1:]] == want:
            return cand
    raise NotImplementedError(f"mncore: no out-of-place view op matches {schema.name}.{schema.overload_name}")


def split_views(op: Any, args: tuple, shape: tuple) -> list[tuple[Any, tuple]] | None:
    """Rewrite multi-output view ops (``args`` excludes self) as one single-output view each."""
    if op is aten.split.Tensor or op is aten.split_with_sizes.default:
        dim = (args[1] if len(args) > 1 else 0) % len(shape)
        n = shape[dim]
        if op is aten.split.Tensor:
            step = args[0]
            sizes = [min(step, n - s) for s in range(0, n, step)] or [0]
        else:
            sizes = list(args[0])
        out, start = [], 0
        for s in sizes:
            out.append((aten.slice.Tensor, (dim, start, start + s, 1)))
            start += s
        return out
    if op is aten.unbind.int:
        dim = (args[0] if args else 0) % len(shape)
        return [(aten.select.int, (dim, i)) for i in range(shape[dim])]
    return None


def inverse(op: Any, args: tuple, parent_shape: tuple) -> tuple[str, Any, tuple]:
    """How to push a new child value back into the parent: ('reshape'|'permute'|'scatter'|'same', op, args)."""
    if op in RESHAPES:
        return ("call", aten.view.default, (list(parent_shape),))
    if op is aten.t.default:
        return ("call", aten.t.default, ())
    if op is aten.transpose.int:
        return ("call", aten.transpose.int, tuple(args))
    if op is aten.permute.default:
        dims = [d % len(parent_shape) for d in args[0]]
        inv = [0] * len(dims)
        for i, d in enumerate(dims):
            inv[d] = i
        return ("call", aten.permute.default, (inv,))
    if op in SCATTERS:
        return ("scatter", SCATTERS[op], tuple(args))
    if op is aten.expand.default:
        return ("expand", None, ())
    raise NotImplementedError(f"mncore: writing through a view made by {op} is not supported")


def apply_eager(op: Any, args: tuple, tensor: torch.Tensor) -> torch.Tensor:
    """Apply one chain element to a real tensor (host reads of a view of synced data)."""
    op = LAZY_BIT_VIEWS.get(op, op)
    if op in RESHAPES or op is aten.view.default:
        return tensor.reshape(args[0]) if op in (aten.view.default, aten._reshape_alias.default,
                                                   aten._unsafe_view.default) else op(tensor, *args)
    return op(tensor, *[list(a) if isinstance(a, tuple) else a for a in args])
