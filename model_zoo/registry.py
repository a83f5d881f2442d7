"""All zoo specs by name; each module under ``model_zoo/models`` exports ``SPECS``."""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from model_zoo.spec import ModelSpec


@lru_cache(maxsize=1)
def _specs() -> dict[str, ModelSpec]:
    import model_zoo.models as pkg

    out: dict[str, ModelSpec] = {}
    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        for spec in importlib.import_module(f"model_zoo.models.{mod}").SPECS:
            if spec.name in out:
                raise ValueError(f"duplicate zoo model name {spec.name!r} (in model_zoo/models/{mod}.py)")
            out[spec.name] = spec
    return out


def all_specs() -> list[ModelSpec]:
    return list(_specs().values())


def names() -> list[str]:
    return list(_specs())


def get(name: str) -> ModelSpec:
    specs = _specs()
    if name not in specs:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(specs)}")
    return specs[name]
