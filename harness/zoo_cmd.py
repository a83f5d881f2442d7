"""`harness zoo list`: the zoo's models and their traits as a table."""
from __future__ import annotations

import json


def table(with_params: bool = False) -> str:
    import pandas as pd

    import model_zoo
    from harness.registry_cmd import DEFAULT_PATH

    syncs = {}
    if DEFAULT_PATH.exists():
        header = json.loads(DEFAULT_PATH.open().readline())
        syncs = header.get("models", {})
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
