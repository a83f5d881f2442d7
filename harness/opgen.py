"""Turn a shape-registry row back into a runnable op call with valid inputs.

Values are drawn from the row's recorded ranges, so indices stay in range (they were valid in
the real run) and domain-restricted ops (log, sqrt, probabilities) get in-domain inputs; rows
recorded only by the lazy tracer have no ranges and fall back to standard normal floats and, for
integer tensors that index another argument, ``[0, size of the indexed dim)``. Non-contiguous
layouts are rebuilt with the recorded strides.
"""
from __future__ import annotations

import importlib
from typing import Any

import torch

from shape_registry.format import Entry

_SORT_LIKE = ("sort", "topk", "kthvalue", "mode", "median", "max.dim", "min.dim", "cummax", "cummin", "argsort")


def resolve_op(name: str) -> Any:
    """``aten.addmm.default`` -> the OpOverload; a clear error for ops this torch lacks. Ops of the
    ``torchvision`` namespace (``roi_align``, ``nms``) exist once torchvision is imported."""
    try:
        ns, op, overload = name.split(".", 2)
        if ns == "torchvision":
            importlib.import_module("torchvision")  # registers torch.ops.torchvision
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (ValueError, AttributeError):
        raise LookupError(f"op {name!r} does not exist in torch {torch.__version__}") from None


def is_random(op: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags


def index_outputs_unstable(op_name: str) -> bool:
    """Sort-like ops may order ties differently: compare their values, not their indices."""
    base = op_name.split(".", 1)[1]
    return any(base.startswith(s) for s in _SORT_LIKE)


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in registry row")
    return dt


def _values(spec: dict, g: torch.Generator, sizes_of: dict) -> torch.Tensor:
    shape, dtype = spec["shape"], _dtype(spec["dtype"])
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < spec.get("true_frac", 0.5)
    lo_hi = spec.get("range")
    if "indexes" in spec:
        target, dim = spec["indexes"]
        size = sizes_of.get(target, [None])
        bound = size[dim] if isinstance(size, list) and len(size) > dim else None
        if lo_hi is None and bound is not None:
            lo_hi = [0, bound - 1]
        elif lo_hi is not None and bound is not None:  # (a dimension a mutation shrank: both ends within it)
            lo_hi = [min(lo_hi[0], bound - 1), min(lo_hi[1], bound - 1)]
        if bound == 0 and not (dtype.is_floating_point or dtype.is_complex):
            # an empty dimension has no valid index: each is out of range (eager raises, and so must mncore)
            return torch.zeros(shape, dtype=dtype)
    if dtype.is_floating_point or dtype.is_complex:
        if lo_hi is None:
            return torch.randn(shape, generator=g).to(dtype)
        lo, hi = float(lo_hi[0]), float(lo_hi[1])
        return (torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    lo, hi = (0, 1) if lo_hi is None else (int(lo_hi[0]), int(lo_hi[1]))
    ignore = sizes_of.get("__ignore_index__")
    if "indexes" in spec and lo < 0 and ignore is not None and ignore < 0:
        # Negative recorded indices are the op's ignore_index (e.g. nll_loss's -100 padding labels):
        # draw valid indices and mark a tenth of them as ignored, as the real batch did. (Without an
        # ignore_index they count from the end, x[..., -1], and the recorded range is drawn from.)
        out = torch.randint(0, hi + 1, shape, generator=g)
        if out.numel():
            out[torch.rand(shape, generator=g) < 0.1] = ignore
        return out.to(dtype)
    return torch.randint(lo, hi + 1, shape, generator=g).to(dtype)


# cumulative group bounds (grouped_mm's ends, embedding_bag's starts from 0): only sorted values are valid
_SORTED_ARGS = ("offs", "offsets", "cu_seqlens")


def _rois(spec: dict, g: torch.Generator, sizes_of: dict) -> torch.Tensor:
    """torchvision's boxes ``[K, 5]`` (``roi_align``): a batch index below the batch size, then x1, y1,
    x2, y2 in the recorded range with x1 <= x2 and y1 <= y2. Other batch indices make torchvision's CPU
    kernel read (and its backward write) outside the tensors."""
    vals = _values(spec, g, sizes_of)
    vals[:, 0] = torch.randint(0, max(int(sizes_of.get("__batch__") or 1), 1), (vals.shape[0],), generator=g)
    for lo, hi in ((1, 3), (2, 4)):
        pair = vals[:, [lo, hi]].sort(dim=1).values
        vals[:, lo], vals[:, hi] = pair[:, 0], pair[:, 1]
    return vals


def _tensor(spec: dict, g: torch.Generator, sizes_of: dict, name: str = "") -> torch.Tensor:
    if name == "rois" and len(spec["shape"]) == 2 and spec["shape"][1] == 5:
        return _rois(spec, g, sizes_of)
    if spec.get("contiguous", True) or not spec["shape"]:
        vals = _values(spec, g, sizes_of)
        if name in _SORTED_ARGS and vals.dim() == 1 and vals.numel():
            vals = vals.sort().values
            if "range" in spec:  # the first and last bounds are the real run's (from 0, all rows)
                vals[0], vals[-1] = spec["range"][0], spec["range"][1]
        return vals
    # Rebuild the recorded layout, overlapping ones (stride 0 from expand) included: values fill the
    # smallest storage the strides address, viewed with as_strided.
    shape, stride = spec["shape"], spec["stride"]
    return _values(dict(spec, shape=[_extent(shape, stride)]), g, sizes_of).as_strided(shape, stride)


def _extent(shape: list, stride: list) -> int:
    """Elements of storage a strided view addresses (overlapping layouts included)."""
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride) if n > 0) if all(n > 0 for n in shape) else 0


def _build(arg: Any, g: torch.Generator, sizes_of: dict, device: torch.device, name: str = "") -> Any:
    t = arg.get("t") if isinstance(arg, dict) else None
    if t == "tensor":
        return _tensor(arg, g, sizes_of, name)
    if t == "list":
        return [_build(a, g, sizes_of, device) for a in arg["items"]]
    if t == "dtype":
        return _dtype(arg["v"])
    if t == "device":
        return device
    if t == "layout":
        return getattr(torch, arg["v"])
    if t == "memory_format":
        return getattr(torch, arg["v"])
    if t == "float" and isinstance(arg["v"], str):
        return float(arg["v"])
    return arg["v"]


def make_inputs(entry: Entry, seed: int = 0) -> tuple[list, dict]:
    """CPU arguments for ``entry`` (device arguments say cpu; move them with ``to_device``)."""
    op = resolve_op(entry.op)
    names = [a.name for a in op._schema.arguments]
    sizes_of = {n: a.get("shape") for n, a in zip(names, entry.args) if isinstance(a, dict)}
    sizes_of.update({k: v.get("shape") for k, v in entry.kwargs.items() if isinstance(v, dict)})
    named = dict(zip(names, entry.args), **entry.kwargs)
    if isinstance(named.get("ignore_index"), dict):
        sizes_of["__ignore_index__"] = named["ignore_index"].get("v")
    batch = named.get("batch_size")  # roi_align's backward names it; its forward's input has it as dim 0
    sizes_of["__batch__"] = batch.get("v") if isinstance(batch, dict) else (sizes_of.get("input") or [1])[0]
    g = torch.Generator().manual_seed(seed)
    cpu = torch.device("cpu")
    args = [_build(a, g, sizes_of, cpu, n) for a, n in zip(entry.args, names)]
    kwargs = {k: _build(v, g, sizes_of, cpu, k) for k, v in entry.kwargs.items()}
    if entry.op.startswith("aten.index_put"):
        indices = args[1] if len(args) > 1 else kwargs["indices"]
        values = args[2] if len(args) > 2 else kwargs["values"]
        target = args[0] if args else kwargs["self"]
        _mask_counts(indices, values, target, g)
        _place_indices(indices, named["indices"], target, g, not (named.get("accumulate") or {}).get("v", False))
    return args, kwargs


def _mask_counts(indices: list, values: torch.Tensor, target: torch.Tensor, g: torch.Generator) -> None:
    """A boolean mask among ``index_put``'s indices selects as many places as it has true elements, and
    that count must match the integer indices beside it and the values written (broadcasting aside), as
    it did in the recorded run: draw each mask with exactly that many true elements."""
    masks = [t for t in indices if isinstance(t, torch.Tensor) and t.dtype == torch.bool]
    if not masks:
        return
    lengths = {t.numel() for t in indices if isinstance(t, torch.Tensor) and t.dtype != torch.bool} - {1}
    rest = target.dim() - sum(t.dim() if t.dtype == torch.bool else 1 for t in indices if t is not None)
    count = next(iter(lengths)) if len(lengths) == 1 else (
        values.shape[values.dim() - rest - 1] if values.dim() > rest else None)
    if count is None or count == 1:
        return
    for m in masks:
        flat = torch.zeros(m.numel(), dtype=torch.bool)
        flat[torch.randperm(m.numel(), generator=g)[: min(count, m.numel())]] = True
        m.copy_(flat.view(m.shape))


def _place_indices(built: list, spec: dict, target: torch.Tensor, g: torch.Generator, distinct: bool) -> None:
    """Integer indices of ``index_put`` within the dimension they index: a boolean mask before them spans
    as many dimensions as it has (the row records each index's place in the list, not its dimension).
    Without ``accumulate``, the first integer index is drawn without repeats where its range allows: which
    of the values sent to a repeated place is written is up to the kernel."""
    dim = 0
    for t, s in zip(built, spec.get("items", ())):
        if not isinstance(t, torch.Tensor):
            dim += 1
            continue
        if t.dtype == torch.bool:
            dim += t.dim()
            continue
        size = target.shape[dim] if dim < target.dim() else None
        dim += 1
        if size is None or not t.numel():
            continue
        lo, hi = s.get("range", [0, size - 1])
        hi = min(hi, size - 1)
        lo = min(max(lo, -size), hi)  # (a dimension a mutation shrank or emptied: an empty one gets -1, out of range)
        if t.min() < lo or t.max() > hi:
            t.copy_(torch.randint(lo, hi + 1, t.shape, generator=g))
        if distinct and t.dim() == 1 and hi - lo + 1 >= t.numel():
            t.copy_(lo + torch.randperm(hi - lo + 1, generator=g)[: t.numel()])
            distinct = False


def to_device(x: Any, device: str) -> Any:
    """Move tensors (keeping strides) and device arguments to ``device``."""
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, torch.device):
        return torch.device(device)
    if isinstance(x, list):
        return [to_device(a, device) for a in x]
    if isinstance(x, dict):
        return {k: to_device(v, device) for k, v in x.items()}
    return x


def clone(x: Any) -> Any:
    """A copy with the same layout, overlapping strides included (copying the addressed storage)."""
    if isinstance(x, torch.Tensor):
        n = _extent(list(x.shape), list(x.stride()))
        return x.as_strided([n], [1]).clone().as_strided(x.shape, x.stride())
    if isinstance(x, list):
        return [clone(a) for a in x]
    if isinstance(x, dict):
        return {k: clone(v) for k, v in x.items()}
    return x


def describe(entry: Entry) -> str:
    """A readable pytest id: op and shapes, e.g. ``aten.addmm.default[f32(64)|f32(64,512)|f32(512,64)]``."""
    def one(a: Any) -> str:
        if isinstance(a, dict) and a.get("t") == "tensor":
            d = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int64": "i64",
                 "int32": "i32", "bool": "b8", "uint8": "u8", "int8": "i8"}.get(a["dtype"], a["dtype"])
            return f"{d}({','.join(map(str, a['shape']))}){'' if a.get('contiguous', True) else 'nc'}"
        if isinstance(a, dict) and a.get("t") == "list":
            inner = [one(x) for x in a["items"]]
            return f"[{len(inner)}x{inner[0]}]" if inner and len(set(inner)) == 1 and len(inner) > 3 else "[" + ",".join(inner) + "]"
        if isinstance(a, dict):
            return str(a.get("v"))
        return str(a)
    parts = [one(a) for a in entry.args] + [f"{k}={one(v)}" for k, v in entry.kwargs.items()]
    text = "|".join(parts)
    return f"{entry.op}[{text[:150]}]"
