"""The model catalog: models collected programmatically from transformers' and torchvision's registries
(random weights, tiny configs), their derived traits and build status in one committed file.

``candidates()`` names every model tried (cheap: nothing is built); ``spec(name)`` makes a runnable
``ModelSpec`` of one; ``load()`` reads the catalog file ``harness zoo collect`` writes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model_zoo.spec import ModelSpec

FORMAT_VERSION = 1
PATH = Path(__file__).resolve().parent / "catalog.jsonl"


def candidates() -> list[str]:
    """Every catalog name to try: transformers' model types with a task head, then torchvision's models."""
    from model_zoo.catalog import hf, tv

    return sorted(hf.candidates()) + sorted(tv.candidates())


def is_candidate(name: str) -> bool:
    """Whether ``name`` is a catalog candidate (only the registry its prefix names is imported)."""
    from model_zoo.catalog import hf, tv

    return (name.startswith(hf.PREFIX) and name in hf.candidates()) or \
        (name.startswith(tv.PREFIX) and name in tv.candidates())


def spec(name: str) -> ModelSpec:
    from model_zoo.catalog import hf, tv

    return hf.spec(name) if name.startswith(hf.PREFIX) else tv.spec(name)


@dataclass
class Entry:
    """One catalog row: where the model comes from, whether it built and trained a step, its traits."""

    name: str
    source: str  # zoo, transformers or torchvision
    family: str
    task: str
    status: str  # ok, or excluded (with the reason)
    reason: str = ""
    build_s: float | None = None
    step_s: float | None = None
    params: int | None = None
    traits: dict[str, list[str]] = field(default_factory=dict)
    headline: bool = False

    def to_json(self) -> dict[str, Any]:
        """Every field, less the optional ones left unset."""
        required = ("name", "source", "family", "task", "status")
        return {k: v for k, v in self.__dict__.items() if k in required or v not in (None, "", {}, False)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Entry:
        return Entry(**d)


class CatalogError(ValueError):
    """The catalog file cannot be read; the message names it and the fix."""


def save(entries: list[Entry], header: dict[str, Any], path: Path = PATH) -> None:
    """JSON lines: a header (format version, library versions, counts), then the rows sorted by name."""
    rows = sorted(entries, key=lambda e: e.name)
    head = {"format_version": FORMAT_VERSION, **header, "tried": len(rows),
            "ok": sum(e.status == "ok" for e in rows)}
    path.write_text("\n".join(json.dumps(r, sort_keys=True) for r in [head] + [e.to_json() for e in rows]) + "\n")


def load(path: Path = PATH) -> tuple[dict[str, Any], list[Entry]]:
    """The header and the rows of the catalog file (refused with the fix when missing or corrupt)."""
    fix = "regenerate it with `harness zoo collect` or restore it (git checkout -- model_zoo/catalog/catalog.jsonl)"
    if not path.exists():
        raise CatalogError(f"no catalog file {path}; {fix}")
    lines = path.read_text().splitlines()
    try:
        header = json.loads(lines[0])
        entries = [Entry.from_json(json.loads(line)) for line in lines[1:] if line.strip()]
    except (IndexError, json.JSONDecodeError, TypeError) as e:
        raise CatalogError(f"catalog file {path} is corrupt ({e}); {fix}") from None
    if header.get("format_version") != FORMAT_VERSION:
        raise CatalogError(f"catalog file {path} has format {header.get('format_version')!r}, "
                           f"this code reads {FORMAT_VERSION}; {fix}")
    return header, entries


def built(path: Path = PATH) -> list[Entry]:
    """The catalog rows that built and trained a step (status ok)."""
    return [e for e in load(path)[1] if e.status == "ok"]
