"""`harness zoo list`: the zoo's models and their traits as a table."""
from __future__ import annotations

import json
from pathlib import Path


class RegistryError(ValueError):
    """The shape registry's header (where the sync counts come from) cannot be read."""


def recorded_models(path: Path) -> dict:
    """The registry header's per-model facts ({} when there is no registry yet)."""
    if not path.exists():
        return {}
    with path.open() as f:
        first = f.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError:
        why = "is empty" if not first.strip() else "has no JSON header line"
        raise RegistryError(f"shape registry {path} {why}; re-record it (harness registry record) or restore it "
                            "(git checkout -- shape_registry/data/registry.jsonl)") from None
    models = header.get("models", {}) if isinstance(header, dict) else None
    if not isinstance(models, dict):
        raise RegistryError(f"shape registry {path}: the header line has no 'models' table; re-record it "
                            "(harness registry record)")
    return models


def table(with_params: bool = False) -> str:
    import pandas as pd

    import model_zoo
    from harness import registry_cmd

    syncs = recorded_models(registry_cmd.DEFAULT_PATH)
    rows = []
    for s in model_zoo.all_specs():
        row = {"model": s.name, "family": s.family, **{k: s.traits.get(k, "") for k in model_zoo.TRAIT_KEYS}}
        row["configs"] = ",".join(s.configs)
        if with_params:
            row["params(tiny)"] = s.parameter_count("tiny")
        for cfg in ("tiny", "default"):
            n = syncs.get(f"{s.name}:{cfg}", {}).get("implicit_syncs_per_step")
            row[f"syncs({cfg})"] = "" if n is None else n
        rows.append(row)
    return pd.DataFrame(rows).to_string(index=False)
