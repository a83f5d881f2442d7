"""Per-op facts read once from the aten schema: mutation, aliasing, lifting and randomness."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

aten = torch.ops.aten

# Ops whose output *shape* depends on scalar values: their floats stay in the graph key.
_NO_LIFT_PREFIXES = ("arange", "range", "linspace", "logspace", "_upsample", "upsample")

# Pure reads of values on the host; handled by the host path, never traced.
HOST_OPS = {
    aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default, aten.allclose.default,
}

# Tagged ``nondeterministic_seeded`` for their dropout, but their kernel refuses ``dropout_p > 0``
# ("Currently do not support dropout > 0"), so the output never depends on the random stream.
_DETERMINISTIC = frozenset({"_scaled_dot_product_flash_attention_for_cpu"})


# Views that set a lazy bit (conjugate, negative) on their result: computed physically wherever a view
# chain or a graph runs them on real buffers, since later views (view_as_real) refuse unresolved bits.
LAZY_BIT_VIEWS = {aten._conj.default: aten.conj_physical.default, aten._neg_view.default: aten.neg.default}


@dataclass(eq=False)
class OpInfo:
    """What the tracer needs to know about one ``OpOverload``."""

    op: Any
    name: str
    kind: str  # 'functional' | 'view' | 'mutating' | 'host'
    mutated: tuple[int, ...] = ()  # schema positions of mutated arguments
    mutated_names: tuple[str, ...] = ()
    out_names: tuple[str, ...] = ()  # keyword-only out= arguments
    functional: Any = None  # variant without mutation, when one matches the schema
    lift_pos: frozenset = frozenset()  # positions/names whose float values are lifted to inputs
    random: bool = False
    has_generator: bool = False
    returns_alias: tuple = ()  # per return: index of the mutated arg it aliases, or None
    arg_names: tuple[str, ...] = field(default=())
    # positions/names of advanced-indexing index lists (``Tensor?[] indices``), whose CPU tensors eager
    # PyTorch moves to the indexed tensor's device (``x_cuda[idx_cpu]``) instead of refusing them
    host_indices: frozenset = frozenset()


_LIFTABLE_TYPES = frozenset({
    "Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]",
    "number", "Optional[number]", "List[number]",
})

# Legacy schemas that write to arguments without declaring it: (op name, mutated positions).
_UNDECLARED_MUTATIONS = {
    "native_batch_norm": (3, 4),  # running_mean, running_var (updated when training=True)
}

# In-place ops that change a tensor's shape/strides (applied to the wrapper's metadata, not traced as values).
METADATA_INPLACE = frozenset({
    "squeeze_", "unsqueeze_", "transpose_", "t_", "swapdims_", "swapaxes_", "as_strided_", "resize_",
    "resize_as_", "set_", "_resize_output_",
})


def named_args(op: Any, args: Any, kwargs: dict) -> dict:
    """An op's arguments by schema name, defaults included."""
    schema = op._schema.arguments
    named = {s.name: s.default_value for s in schema if s.has_default_value()}
    named.update(zip((s.name for s in schema), args))
    named.update(kwargs)
    return named


def _liftable_type(t: Any) -> bool:
    """Schema positions whose Python floats may be lifted to graph inputs (str() of the JIT type)."""
    return str(t) in _LIFTABLE_TYPES


def _find_functional(op: Any, mutated_names: tuple[str, ...], out_names: tuple[str, ...]) -> Any:
    """Find the overload that computes the same thing without writing to any argument."""
    schema = op._schema
    base = schema.name.split("::")[1]
    if out_names:
        name = base
    elif base.endswith("_") and not base.endswith("__"):
        name = base[:-1]
    else:
        return None
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in out_names]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cs = cand._schema
        if any(a.alias_info is not None and a.alias_info.is_write for a in cs.arguments):
            continue
        if [(a.name, str(a.type)) for a in cs.arguments] == want and len(cs.returns) == max(1, len(out_names) or len(schema.returns)):
            return cand
    return None


def analyze(op: Any) -> OpInfo:
    schema = op._schema
    name = schema.name.split("::")[1] + ("." + schema.overload_name if schema.overload_name else "")
    args = schema.arguments
    mutated = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    mutated_names = tuple(args[i].name for i in mutated)
    out_names = tuple(args[i].name for i in mutated if args[i].kwarg_only)
    lift = frozenset()
    if not name.startswith(_NO_LIFT_PREFIXES):
        lift = frozenset([i for i, a in enumerate(args) if _liftable_type(a.type)] +
                         [a.name for a in args if _liftable_type(a.type)])
    random = torch.Tag.nondeterministic_seeded in op.tags and schema.name.split("::")[1] not in _DETERMINISTIC
    has_gen = any(a.name == "generator" for a in args)
    indices = [(i, a.name) for i, a in enumerate(args) if a.name == "indices" and str(a.type) == "List[Optional[Tensor]]"]
    info = OpInfo(op=op, name=name, kind="functional", lift_pos=lift, random=random, has_generator=has_gen,
                  arg_names=tuple(a.name for a in args), host_indices=frozenset(x for pair in indices for x in pair))
    base = schema.name.split("::")[1]
    if base in _UNDECLARED_MUTATIONS and not mutated:
        mutated = _UNDECLARED_MUTATIONS[base]
        mutated_names = tuple(args[i].name for i in mutated)
        out_names = ()
    if op in HOST_OPS:
        info.kind = "host"
    elif base in METADATA_INPLACE:
        info.kind = "metadata_inplace"
    elif base == "to" or base == "lift_fresh_copy":
        info.kind = "to"
    elif mutated:
        info.kind = "mutating"
        info.mutated, info.mutated_names, info.out_names = mutated, mutated_names, out_names
        info.functional = _find_functional(op, mutated_names, out_names) if base not in _UNDECLARED_MUTATIONS else None
        alias_of = []
        for r in schema.returns:
            idx = None
            if r.alias_info is not None:
                for i in mutated:
                    ai = args[i].alias_info
                    if ai is not None and set(ai.before_set) & set(r.alias_info.before_set):
                        idx = i
            alias_of.append(idx)
        info.returns_alias = tuple(alias_of)
    elif any(r.alias_info is not None for r in schema.returns):
        info.kind = "view"
    return info


_cache: dict[Any, OpInfo] = {}


def info_for(op: Any) -> OpInfo:
    info = _cache.get(op)
    if info is None:
        info = _cache[op] = analyze(op)
    return info
