"""Recorders: which aten ops (and with what arguments) a model's training step runs.

``EagerRecorder`` is a ``TorchDispatchMode`` around eager CPU execution (real values, so integer
and boolean tensors get value ranges). ``LazyRecorder`` observes the ``mncore`` lazy tracer: the
functional ops the device is actually asked to run (after in-place ops became functional ones),
with metadata only (values do not exist yet while tracing).

Exclusion rule (reported per op in the registry header): constructors (no tensor input, ``*_like``,
``new_*``), views and aliases (schema returns an alias without writing, plus ``_unsafe_view`` and
``_reshape_alias``, which reshape without computing), host reads and transfers
(``_local_scalar_dense``, ``equal``, copies across devices) and pure metadata queries.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from shape_registry.format import Entry, Registry

_HOST = {"_local_scalar_dense", "equal", "is_nonzero", "item", "sym_size", "sym_stride", "sym_numel",
         "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "_copy_from",
         "_copy_from_and_resize", "set_", "resize_", "lift_fresh"}
_CONSTRUCTORS = {"empty", "empty_strided", "scalar_tensor", "zeros", "ones", "full", "arange", "linspace",
                 "logspace", "eye", "randperm", "rand", "randn", "randint", "tril_indices", "triu_indices"}
# Views whose schema does not declare the alias (they reshape without computing).
_UNDECLARED_VIEWS = {"_unsafe_view", "_reshape_alias", "lift_fresh"}


def _is_constructor(base: str) -> bool:
    """Ops that only allocate from metadata: factories, ``*_like`` and ``new_*``."""
    return base in _CONSTRUCTORS or base.endswith("_like") or base.startswith("new_")


def _is_view(op: Any, base: str) -> bool:
    return base in _UNDECLARED_VIEWS or any(
        r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)
_RANGE_SAMPLE = 1 << 20  # value ranges of larger tensors are taken from an evenly strided sample

# Integer arguments that index a dimension of another argument: op base name -> (index arg, indexed arg, dim)
_INDEX_RULES: dict[str, tuple[str, str, Any]] = {
    "embedding": ("indices", "weight", 0),
    "gather": ("index", "self", "dim"),
    "scatter": ("index", "self", "dim"),
    "scatter_add": ("index", "self", "dim"),
    "scatter_reduce": ("index", "self", "dim"),
    "index_select": ("index", "self", "dim"),
    "index_add": ("index", "self", "dim"),
    "index_copy": ("index", "self", "dim"),
    "nll_loss_forward": ("target", "self", "class"),
    "nll_loss2d_forward": ("target", "self", 1),
    "nll_loss_backward": ("target", "self", "class"),
    "nll_loss2d_backward": ("target", "self", 1),
}


def op_name(op: Any) -> str:
    """``aten.addmm.default`` style name of an OpOverload."""
    return str(op)


def exclusion(op: Any, args: tuple, kwargs: dict) -> str | None:
    """Why an op is not a registry row (None: it is recorded)."""
    schema = op._schema
    base = schema.name.split("::")[1]
    if base in _HOST:
        return "host/metadata"
    if _is_constructor(base):
        return "constructor"
    if _is_view(op, base):
        return "view"
    tensors = [a for a in _flat(list(args) + list(kwargs.values())) if isinstance(a, torch.Tensor)]
    if not tensors:
        return "constructor"
    if base in ("copy_", "_to_copy") and len({t.device.type for t in tensors} | _target_device(kwargs)) > 1:
        return "transfer"
    return None


def _target_device(kwargs: dict) -> set:
    dev = kwargs.get("device")
    return {torch.device(dev).type} if dev is not None else set()


def _flat(xs: list) -> list:
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flat(list(x)))
        else:
            out.append(x)
    return out


def _range(t: torch.Tensor) -> dict:
    if t.numel() == 0 or t.is_complex() or t.device.type == "meta":
        return {}
    flat = t.detach().reshape(-1)
    if flat.numel() > _RANGE_SAMPLE:
        flat = flat[:: flat.numel() // _RANGE_SAMPLE + 1]
    if t.dtype == torch.bool:
        return {"true_frac": round(float(flat.float().mean()), 4)}
    if t.is_floating_point():
        flat = flat[torch.isfinite(flat)]
        if flat.numel() == 0:
            return {}
        flat = flat.double()
    return {"range": [_num(flat.min().item()), _num(flat.max().item())]}


def _num(v: float | int) -> float | int:
    return round(v, 6) if isinstance(v, float) else v


def norm_arg(a: Any, meta_of: Callable[[Any], tuple | None], values: bool) -> Any:
    """Structured JSON for one argument (see ``shape_registry.format``)."""
    meta = meta_of(a)
    if meta is None and isinstance(a, torch.Tensor):  # a host tensor among device ones (a 0-dim CPU scalar)
        meta = _eager_meta(a)
    if meta is not None:
        shape, stride, dtype = meta
        contiguous = _is_contiguous(shape, stride)
        out = {"t": "tensor", "shape": list(shape), "dtype": str(dtype).replace("torch.", ""),
               "stride": list(stride), "contiguous": contiguous}
        if values and isinstance(a, torch.Tensor):
            out.update(_range(a))
        return out
    if isinstance(a, (list, tuple)):
        return {"t": "list", "items": [norm_arg(x, meta_of, values) for x in a]}
    if a is None:
        return {"t": "none", "v": None}
    if isinstance(a, bool):
        return {"t": "bool", "v": a}
    if isinstance(a, int):
        return {"t": "int", "v": a}
    if isinstance(a, float):
        return {"t": "float", "v": a if a == a and abs(a) != float("inf") else str(a)}
    if isinstance(a, torch.dtype):
        return {"t": "dtype", "v": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"t": "device", "v": None}  # devices are normalised away: rows are device independent
    if isinstance(a, torch.layout):
        return {"t": "layout", "v": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"t": "memory_format", "v": str(a).replace("torch.", "")}
    return {"t": "str", "v": str(a)}


def _is_contiguous(shape: tuple, stride: tuple) -> bool:
    expected = 1
    for size, st in reversed(list(zip(shape, stride))):
        if size != 1 and st != expected:
            return False
        expected *= size
    return True


def _eager_meta(a: Any) -> tuple | None:
    return (tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else None


def make_entry(op: Any, args: tuple, kwargs: dict, model: str, source: str,
               meta_of: Callable[[Any], tuple | None], values: bool) -> Entry:
    schema_names = [x.name for x in op._schema.arguments]
    nargs = [norm_arg(a, meta_of, values) for a in args]
    nkw = {k: norm_arg(v, meta_of, values) for k, v in kwargs.items()}
    _mark_indexes(op, schema_names, nargs, nkw)
    return Entry(op_name(op), nargs, nkw, 1, {model}, {source})


def _mark_indexes(op: Any, names: list[str], nargs: list, nkw: dict) -> None:
    base = op._schema.name.split("::")[1]
    named = dict(zip(names, nargs))
    named.update(nkw)
    if base in ("index", "index_put", "_index_put_impl"):
        idx = named.get("indices")
        if isinstance(idx, dict) and idx.get("t") == "list":
            for d, item in enumerate(idx["items"]):
                if isinstance(item, dict) and item.get("t") == "tensor":
                    item["indexes"] = ["self", d]
        return
    rule = _INDEX_RULES.get(base)
    if rule is None:
        return
    index, target, dim = rule
    t_idx, t_tgt = named.get(index), named.get(target)
    if not (isinstance(t_idx, dict) and t_idx.get("t") == "tensor" and isinstance(t_tgt, dict)):
        return
    if dim == "class":
        dim = 1 if len(t_tgt.get("shape", [])) > 1 else 0
    elif isinstance(dim, str):
        d = named.get(dim)
        dim = d["v"] if isinstance(d, dict) else 0
    t_idx["indexes"] = [target, dim]


class EagerRecorder(TorchDispatchMode):
    """Records every aten op run eagerly inside the ``with`` block into ``registry``."""

    def __init__(self, registry: Registry, model: str):
        super().__init__()
        self.registry, self.model = registry, model

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = exclusion(func, args, kwargs)
        if why is None:
            self.registry.add(make_entry(func, args, kwargs, self.model, "eager", _eager_meta, values=True))
        else:
            key = f"{why}:{op_name(func)}"
            self.registry.excluded[key] = self.registry.excluded.get(key, 0) + 1
        return func(*args, **kwargs)


class LazyRecorder:
    """Observes the ops the ``mncore`` tracer records (context manager)."""

    def __init__(self, registry: Registry, model: str):
        self.registry, self.model = registry, model

    def _observe(self, op: Any, args: tuple, kwargs: dict) -> None:
        from mncore import observe

        why = exclusion_lazy(op)
        if why is None:
            self.registry.add(make_entry(op, args, kwargs, self.model, "lazy", observe.arg_meta, values=False))
        else:
            key = f"{why}:{op_name(op)}"
            self.registry.excluded[key] = self.registry.excluded.get(key, 0) + 1

    def __enter__(self) -> LazyRecorder:
        from mncore import observe

        observe.add_op_observer(self._observe)
        return self

    def __exit__(self, *exc: Any) -> None:
        from mncore import observe

        observe.remove_op_observer(self._observe)


def exclusion_lazy(op: Any) -> str | None:
    base = op._schema.name.split("::")[1]
    if _is_constructor(base):
        return "constructor"
    if _is_view(op, base):
        return "view"
    return None
