"""On-disk format: JSON lines sorted by a canonical key, one header line with the format version.

An argument is stored as structured JSON, never as code to ``eval``:
  tensor  {"t": "tensor", "shape": [...], "dtype": "float32", "stride": [...], "contiguous": true,
           "range": [lo, hi] (finite min/max seen), "true_frac": f (bool only), "indexes": [arg, dim]}
  scalar  {"t": "float"|"int"|"bool"|"str"|"none", "v": value}
  list    {"t": "list", "items": [...]}
  other   {"t": "dtype"|"device"|"layout"|"memory_format", "v": "..."}
``range`` merges as the union over every call with the same signature; ``count`` adds up.
The file leaves out what a tensor's shape implies (version 2): ``stride`` when it is the contiguous one
and ``contiguous`` when true; reading puts them back, so rows in memory always have both. (Optimizer
rows list every parameter: this keeps a catalog-sized registry small enough for git.)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 wrote every tensor's stride and contiguity


def contiguous_strides(shape: list[int]) -> list[int]:
    """The strides of a contiguous tensor of ``shape`` (as torch computes them: size-0 dims count as 1)."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return out[::-1]


def _compact(arg: Any) -> Any:
    """The file form of an argument: tensors without the stride and contiguity their shape implies."""
    if isinstance(arg, dict) and arg.get("t") == "tensor":
        out = {k: v for k, v in arg.items() if not (k == "contiguous" and v is True)}
        if out.get("stride") == contiguous_strides(arg["shape"]) and arg.get("contiguous", True):
            del out["stride"]
        return out
    if isinstance(arg, dict) and arg.get("t") == "list":
        return dict(arg, items=[_compact(a) for a in arg["items"]])
    return arg


def _expand(arg: Any) -> Any:
    """The in-memory form of a file argument (``_compact`` undone, in place)."""
    if isinstance(arg, dict) and arg.get("t") == "tensor":
        arg.setdefault("contiguous", True)
        if "stride" not in arg:
            arg["stride"] = contiguous_strides(arg["shape"])
    elif isinstance(arg, dict) and arg.get("t") == "list":
        for a in arg["items"]:
            _expand(a)
    return arg


def signature(arg: Any) -> Any:
    """The part of an argument that identifies a registry row (value ranges excluded)."""
    if isinstance(arg, dict):
        if arg.get("t") == "tensor":
            return ["T", arg["shape"], arg["dtype"], arg["stride"]]
        if arg.get("t") == "list":
            return ["L", [signature(a) for a in arg["items"]]]
        return [arg.get("t"), arg.get("v")]
    return arg


@dataclass
class Entry:
    op: str
    args: list
    kwargs: dict
    count: int = 0
    models: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)

    @property
    def key(self) -> str:
        return json.dumps([self.op, [signature(a) for a in self.args],
                           {k: signature(v) for k, v in sorted(self.kwargs.items())}], separators=(",", ":"))

    def tensors(self) -> Iterator[dict]:
        def walk(a: Any) -> Iterator[dict]:
            if isinstance(a, dict) and a.get("t") == "tensor":
                yield a
            elif isinstance(a, dict) and a.get("t") == "list":
                for x in a["items"]:
                    yield from walk(x)
        for a in list(self.args) + list(self.kwargs.values()):
            yield from walk(a)

    def merge(self, other: Entry) -> None:
        self.count += other.count
        self.models |= other.models
        self.sources |= other.sources
        for mine, theirs in zip(self.tensors(), other.tensors()):
            for k in ("range",):
                if k in theirs:
                    if k in mine:
                        mine[k] = [min(mine[k][0], theirs[k][0]), max(mine[k][1], theirs[k][1])]
                    else:
                        mine[k] = list(theirs[k])
            if "true_frac" in theirs:
                mine["true_frac"] = theirs["true_frac"] if "true_frac" not in mine else (mine["true_frac"] + theirs["true_frac"]) / 2
            if "indexes" in theirs:
                mine.setdefault("indexes", theirs["indexes"])

    def to_json(self) -> dict:
        """The file form (tensors compacted)."""
        return {"op": self.op, "args": [_compact(a) for a in self.args],
                "kwargs": {k: _compact(v) for k, v in self.kwargs.items()}, "count": self.count,
                "models": sorted(self.models), "sources": sorted(self.sources)}

    @staticmethod
    def from_json(d: dict) -> Entry:
        missing = [k for k in ("op", "args", "kwargs", "count") if k not in d]
        if missing:
            raise ValueError(f"registry row is missing {', '.join(missing)}: {str(d)[:200]}")
        return Entry(d["op"], [_expand(a) for a in d["args"]], {k: _expand(v) for k, v in d["kwargs"].items()},
                     d["count"], set(d.get("models", ())), set(d.get("sources", ())))


class Registry:
    """Deduplicated rows keyed by (op, argument signatures), plus the exclusions seen while recording."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.excluded: dict[str, int] = {}
        self.models: dict[str, dict] = {}
        self.failed: dict[str, str] = {}  # model configs that could not be recorded: why (kept in the file)

    def add(self, entry: Entry) -> None:
        key = entry.key
        mine = self.entries.get(key)
        if mine is None:
            self.entries[key] = entry
        else:
            mine.merge(entry)

    def merge(self, other: Registry) -> Registry:
        for e in other.entries.values():
            self.add(Entry.from_json(json.loads(json.dumps(e.to_json()))))
        for k, n in other.excluded.items():
            self.excluded[k] = self.excluded.get(k, 0) + n
        self.models.update(other.models)
        self.failed.update(other.failed)
        return self

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.sorted())

    def sorted(self) -> list[Entry]:
        return [self.entries[k] for k in sorted(self.entries)]

    def ops(self) -> list[str]:
        return sorted({e.op for e in self.entries.values()})

    def query(self, op: str | None = None, model: str | None = None) -> list[Entry]:
        out = self.sorted()
        if op:
            out = [e for e in out if e.op == op or e.op.startswith(op + ".")]
        if model:
            out = [e for e in out if any(m == model or m.startswith(model + ":") for m in e.models)]
        return out

    # -- files ------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write atomically: a temporary file renamed over the target."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        with tmp.open("w") as f:
            header = {"format": "mncore-shape-registry", "version": FORMAT_VERSION, "entries": len(self),
                      "excluded": dict(sorted(self.excluded.items())), "models": dict(sorted(self.models.items())),
                      "failed": dict(sorted(self.failed.items()))}
            f.write(json.dumps(header, sort_keys=True) + "\n")
            for e in self.sorted():
                f.write(json.dumps(e.to_json(), sort_keys=True, separators=(",", ":")) + "\n")
        tmp.replace(path)
        return path

    @staticmethod
    def load(path: str | Path) -> Registry:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no shape registry at {path}; record one with `harness registry record`")
        reg = Registry()
        with path.open() as f:
            lines = f.read().splitlines()
        if not lines:
            raise ValueError(f"{path} is empty (expected a header line and JSON rows)")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:1: header is not JSON: {e}") from None
        if header.get("format") != "mncore-shape-registry":
            raise ValueError(f"{path}: not a shape registry file (header {str(header)[:120]})")
        if header.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{path}: registry format version {header.get('version')} is not supported "
                             f"(this code reads versions {', '.join(map(str, READABLE_VERSIONS))}); re-record it")
        reg.excluded = header.get("excluded", {})
        reg.models = header.get("models", {})
        reg.failed = header.get("failed", {})
        for i, line in enumerate(lines[1:], start=2):
            try:
                reg.add(Entry.from_json(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as e:
                raise ValueError(f"{path}:{i}: bad registry row: {e}") from None
        return reg
