"""A fuzz case: one shape-registry row plus an ordered list of mutations, serialisable to JSON.

Why this shape: a case must be rebuilt bit for bit from its JSON alone (reproducible campaigns,
shrinking by dropping or adding mutations, repro scripts), so mutations are stored as data and
applied to the row's argument specs (shape-registry format, ``shape_registry.format``); tensor
values then come from ``harness.opgen.make_inputs`` with the case's ``value_seed``, and the
value mutations (magnitudes, denormals, NaN/Inf, out-of-range indices) are applied to those
tensors with a generator seeded from the same number.

Mutation records (``by`` is ``fuzz`` for the generator's, ``shrink`` for the shrinker's):
  resize  {"from": v, "to": w}                  every tensor dim (and size-like int argument) equal to v
                                                becomes w, so related shapes stay consistent
          {"arg": path, "dim": d, "to": w}      one dim of one tensor (broadcasting, or invalid shapes)
  dtype   {"from": a, "to": b} | {"arg": path, "to": b}
  layout  {"arg": path, "layout": "transposed"|"strided"}
  values  {"arg": path, "dist": "large"|"negative"|"denormal"|"nan"|"inf"|"simple"}
  index_oob {"arg": path}                       one index one past the indexed dim (eager raises)
A ``path`` names a tensor argument: ``a0`` (positional 0), ``a1.2`` (item 2 of list argument 1),
``k:weight`` (keyword).
"""
from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import torch

from harness.opgen import _extent, describe, make_inputs, resolve_op
from shape_registry.format import Entry, contiguous_strides

NONFINITE_DISTS = ("nan", "inf")
VALUE_DISTS = ("large", "negative", "denormal", "simple") + NONFINITE_DISTS
STRUCTURAL = ("resize", "dtype", "layout")
# Non-tensor arguments that carry sizes (layer norm's normalized_shape, *_backward input_sizes,
# embedding_dense_backward's num_weights): a coupled resize updates them with the tensors.
_SIZE_ARG = re.compile(r"size|shape|num_weights")


def tensor_specs(args: list, kwargs: dict) -> Iterator[tuple[str, dict]]:
    """(path, spec) of every tensor argument, in a stable order."""
    def walk(a: Any, path: str) -> Iterator[tuple[str, dict]]:
        if isinstance(a, dict) and a.get("t") == "tensor":
            yield path, a
        elif isinstance(a, dict) and a.get("t") == "list":
            for i, x in enumerate(a["items"]):
                yield from walk(x, f"{path}.{i}")
    for i, a in enumerate(args):
        yield from walk(a, f"a{i}")
    for k, v in kwargs.items():
        yield from walk(v, f"k:{k}")


def get_path(args: list, kwargs: dict, path: str) -> Any:
    """The object (spec or built value) a path names, or None when the path no longer exists."""
    head, *rest = path.split(".")
    try:
        x = kwargs[head[2:]] if head.startswith("k:") else args[int(head[1:])]
        for i in rest:
            x = x["items"][int(i)] if isinstance(x, dict) else x[int(i)]
    except (KeyError, IndexError, ValueError, TypeError):
        return None
    return x


def _dense_in_order(shape: list[int], old_stride: list[int]) -> list[int]:
    """Strides of a dense layout that keeps the recorded dim order (and stride-0 broadcast dims)."""
    order = sorted(range(len(shape)), key=lambda d: -old_stride[d])
    stride, acc = [0] * len(shape), 1
    for d in reversed(order):
        if old_stride[d] == 0:
            continue
        stride[d] = acc
        acc *= max(shape[d], 1)
    return stride


def _restride(spec: dict, old_shape: list[int], old_stride: list[int]) -> None:
    shape, layout = spec["shape"], spec.get("layout")
    if layout == "transposed" and len(shape) >= 2:
        swapped = shape[:-2] + [shape[-1], shape[-2]]
        st = contiguous_strides(swapped)
        spec["stride"], spec["contiguous"] = st[:-2] + [st[-1], st[-2]], False
    elif layout == "strided" and shape:
        spec["stride"], spec["contiguous"] = [2 * s for s in contiguous_strides(shape)], False
    elif spec.get("contiguous", True):
        spec["stride"] = contiguous_strides(shape)
    elif shape != old_shape:
        spec["stride"] = _dense_in_order(shape, old_stride)


@dataclass
class Case:
    op: str
    args: list
    kwargs: dict
    mutations: list[dict] = field(default_factory=list)
    value_seed: int = 0
    row: str = ""
    index: int = -1

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> Case:
        return Case(d["op"], d["args"], d["kwargs"], list(d.get("mutations", [])), int(d.get("value_seed", 0)),
                    d.get("row", ""), int(d.get("index", -1)))

    @staticmethod
    def from_entry(entry: Entry, value_seed: int = 0, index: int = -1) -> Case:
        return Case(entry.op, copy.deepcopy(entry.args), copy.deepcopy(entry.kwargs), [], value_seed,
                    describe(entry), index)

    def with_mutation(self, m: dict) -> Case:
        return Case(self.op, self.args, self.kwargs, self.mutations + [m], self.value_seed, self.row, self.index)

    def without(self, i: int) -> Case:
        return Case(self.op, self.args, self.kwargs, self.mutations[:i] + self.mutations[i + 1:], self.value_seed,
                    self.row, self.index)

    def key(self) -> str:
        """Identity of the case's content (the index is only its position in a campaign)."""
        d = self.to_json()
        d.pop("index")
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    # -- what it stands for -------------------------------------------------------------------
    def entry(self) -> Entry:
        """The registry row after the structural mutations (shapes, dtypes, layouts)."""
        args, kwargs = copy.deepcopy(self.args), copy.deepcopy(self.kwargs)
        before = {p: (list(s["shape"]), list(s["stride"])) for p, s in tensor_specs(args, kwargs)}
        for m in self.mutations:
            if m["kind"] == "resize":
                _resize(self.op, args, kwargs, m)
            elif m["kind"] == "dtype":
                for p, s in tensor_specs(args, kwargs):
                    if p == m.get("arg") or ("arg" not in m and s["dtype"] == m["from"]):
                        s["dtype"] = m["to"]
            elif m["kind"] == "layout":
                s = get_path(args, kwargs, m["arg"])
                if isinstance(s, dict) and s.get("t") == "tensor":
                    s["layout"] = m["layout"]
        for p, s in tensor_specs(args, kwargs):
            _restride(s, *before.get(p, (s["shape"], s["stride"])))
        return Entry(self.op, args, kwargs)

    def numel(self) -> int:
        """Input elements (the shrinker's main size measure)."""
        entry = self.entry()
        return sum(math.prod(s["shape"]) for _, s in tensor_specs(entry.args, entry.kwargs))

    def fuzz_mutations(self) -> list[dict]:
        return [m for m in self.mutations if m.get("by", "fuzz") == "fuzz"]

    def category(self) -> str:
        """``nonfinite`` when NaN/Inf were planted (NaN positions must match); ``invalid`` is decided by eager."""
        return "nonfinite" if any(m.get("dist") in NONFINITE_DISTS for m in self.mutations) else "valid"

    def size_key(self) -> tuple[int, int, int]:
        """(input elements, generator mutations, float inputs without simple values): the shrinker lowers each."""
        entry = self.entry()
        specs = list(tensor_specs(entry.args, entry.kwargs))
        dist = {m["arg"]: m["dist"] for m in self.mutations if m["kind"] == "values"}
        busy = sum(1 for p, s in specs if s["dtype"].startswith(("float", "bfloat")) and dist.get(p) != "simple")
        return sum(math.prod(s["shape"]) for _, s in specs), len(self.fuzz_mutations()), busy

    def describe(self) -> str:
        muts = ", ".join(mutation_label(m) for m in self.mutations) or "unmutated"
        return f"{describe(self.entry())} <{muts}>"

    # -- inputs -------------------------------------------------------------------------------
    def build_inputs(self) -> tuple[list, dict]:
        """CPU arguments: ``make_inputs`` of the mutated row, then the value mutations, all seeded."""
        entry = self.entry()
        args, kwargs = make_inputs(entry, seed=self.value_seed)
        g = torch.Generator().manual_seed(self.value_seed + 1)
        for m in self.mutations:
            if m["kind"] not in ("values", "index_oob"):
                continue
            t = get_path(args, kwargs, m["arg"])
            spec = get_path(entry.args, entry.kwargs, m["arg"])
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            storage = t.as_strided([_extent(list(t.shape), list(t.stride()))], [1], t.storage_offset())
            with torch.no_grad():
                if m["kind"] == "values" and t.is_floating_point():
                    storage.copy_(_distribute(storage, m["dist"], g))
                elif m["kind"] == "index_oob" and not t.is_floating_point() and t.dtype != torch.bool:
                    bound = _indexed_size(self.op, entry, spec)
                    if bound is not None:
                        storage[int(torch.randint(0, storage.numel(), (1,), generator=g))] = bound
        return args, kwargs


def _distribute(x: torch.Tensor, dist: str, g: torch.Generator) -> torch.Tensor:
    """A new value distribution for a float tensor's storage (same dtype, same element count)."""
    fi = torch.finfo(x.dtype)
    xd = x.double()
    if dist == "large":
        out = xd * fi.max ** 0.4
    elif dist == "negative":
        out = -(xd.abs() + 0.5)
    elif dist == "denormal":
        out = xd * fi.tiny * 0.25  # mostly below the smallest normal number
    elif dist == "simple":
        out = xd.round().clamp(-2, 2)
    else:  # nan / inf at about a tenth of the positions (at least one)
        pick = torch.rand(x.shape, generator=g) < 0.1
        pick[int(torch.randint(0, x.numel(), (1,), generator=g))] = True
        if dist == "nan":
            bad = torch.full(x.shape, math.nan, dtype=torch.float64)
        else:
            bad = torch.where(torch.rand(x.shape, generator=g) < 0.5, math.inf, -math.inf).double()
        out = torch.where(pick, bad, xd)
    return out.to(x.dtype)


def _indexed_size(op_name: str, entry: Entry, spec: Any) -> int | None:
    """Size of the dimension an index tensor indexes (recorded as ``indexes: [arg name, dim]``)."""
    if not isinstance(spec, dict) or "indexes" not in spec:
        return None
    target, dim = spec["indexes"]
    names = [a.name for a in resolve_op(op_name)._schema.arguments]
    named = dict(zip(names, entry.args), **entry.kwargs)
    t = named.get(target)
    if isinstance(t, dict) and t.get("t") == "tensor" and dim < len(t["shape"]):
        return int(t["shape"][dim])
    return None


def _resize(op_name: str, args: list, kwargs: dict, m: dict) -> None:
    if "arg" in m:
        s = get_path(args, kwargs, m["arg"])
        if isinstance(s, dict) and s.get("t") == "tensor" and m["dim"] < len(s["shape"]):
            s["shape"][m["dim"]] = m["to"]
        return
    frm, to = m["from"], m["to"]
    for _, s in tensor_specs(args, kwargs):
        s["shape"] = [to if n == frm else n for n in s["shape"]]
    schema = resolve_op(op_name)._schema.arguments
    named = list(zip(schema, args)) + [(a, kwargs[a.name]) for a in schema if a.name in kwargs]
    for a, v in named:
        if not _SIZE_ARG.search(a.name) or not isinstance(v, dict):
            continue
        if v.get("t") == "int" and v["v"] == frm:
            v["v"] = to
        elif v.get("t") == "list":
            for item in v["items"]:
                if isinstance(item, dict) and item.get("t") == "int" and item["v"] == frm:
                    item["v"] = to


def mutation_label(m: dict) -> str:
    """Short readable form, e.g. ``resize 64->65``, ``a1 dim0->1``, ``dtype float32->float16``."""
    k = m["kind"]
    tag = "" if m.get("by", "fuzz") == "fuzz" else "shrink:"
    if k == "resize":
        return tag + (f"{m['arg']} dim{m['dim']}->{m['to']}" if "arg" in m else f"resize {m['from']}->{m['to']}")
    if k == "dtype":
        return tag + (f"{m['arg']} ->{m['to']}" if "arg" in m else f"dtype {m['from']}->{m['to']}")
    if k == "layout":
        return tag + f"{m['arg']} {m['layout']}"
    if k == "values":
        return tag + f"{m['arg']} {m['dist']}"
    return tag + f"{m['arg']} {k}"
