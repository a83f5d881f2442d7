"""All zoo specs by name; each module under ``model_zoo/models`` exports ``SPECS`` (the hand-written
headline models); the catalog's models (``model_zoo.catalog``, names ``hf_*`` and ``tv_*``) and the
training recipes (``model_zoo.recipes``, names ``recipe_*``) are found by ``get`` too."""
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


@lru_cache(maxsize=None)
def _catalog_spec(name: str) -> ModelSpec | None:
    from model_zoo import catalog, recipes

    if name.startswith(recipes.PREFIX):
        return recipes.spec(name) if name in recipes.candidates() else None
    return catalog.spec(name) if catalog.is_candidate(name) else None


def get(name: str) -> ModelSpec:
    specs = _specs()
    if name in specs:
        return specs[name]
    found = _catalog_spec(name)
    if found is None:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(specs)}, the catalog's "
                       "(`harness zoo list --catalog`) and the training recipes (`model_zoo.recipes`)")
    return found
