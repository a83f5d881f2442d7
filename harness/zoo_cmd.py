"""`harness zoo list|traits|collect`: the hand-written zoo and the catalog, their models and traits."""
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


def catalog_table(traits: list[str], everything: bool = False) -> str:
    """The catalog's rows (``--trait K=V`` filters; ``everything``: excluded candidates too, with why)."""
    import pandas as pd

    from harness.argtypes import UsageError
    from model_zoo import catalog
    from model_zoo.catalog.traits import TRAITS

    wanted = []
    for t in traits:
        key, sep, value = t.partition("=")
        if not sep or key not in TRAITS:
            raise UsageError(f"--trait {t!r}: use K=V with K one of {', '.join(TRAITS)} (see `harness zoo traits`)")
        wanted.append((key, value))
    rows = []
    for e in catalog.load()[1]:
        if (e.status != "ok" and not everything) or any(v not in e.traits.get(k, []) for k, v in wanted):
            continue
        row = {"model": e.name, "source": e.source, "family": e.family, "status": e.status}
        row.update({k: "+".join(e.traits.get(k, [])) for k in TRAITS})
        row.update(params=e.params or "", build_s=e.build_s or "", step_s=e.step_s or "")
        if everything:
            row["reason"] = e.reason
        rows.append(row)
    if not rows:
        return "no catalog model matches"
    return pd.DataFrame(rows).to_string(index=False) + f"\n{len(rows)} models"


def traits_table() -> str:
    """Each (trait, value): how many catalog models have it and which representative covers it."""
    from harness import tiers
    from model_zoo import catalog
    from model_zoo.catalog.traits import TRAITS

    entries = catalog.built()
    chosen = tiers.representatives(entries)
    lines = []
    for key in TRAITS:
        values = sorted({v for e in entries for v in e.traits.get(key, [])})
        lines.append(f"{key}:")
        for v in values:
            having = [e.name for e in entries if v in e.traits.get(key, [])]
            by = next((n for n in chosen if n in having), "")
            lines.append(f"  {v:24s} {len(having):4d} models  covered by {by}")
    n_values = sum(1 for line in lines if line.startswith("  "))
    lines.append(f"{len(entries)} catalog models, {n_values} trait values, representative set: {len(chosen)} models "
                 f"({', '.join(chosen)})")
    return "\n".join(lines)


def main(args) -> int:  # noqa: ANN001 - argparse namespace of `harness zoo`
    import sys

    from harness.argtypes import USAGE_ERROR, UsageError
    from model_zoo.catalog import CatalogError

    try:
        if args.zoo_cmd == "collect":
            return _collect(args)
        if args.zoo_cmd == "traits":
            print(traits_table())
        elif args.catalog or args.trait or args.all:
            print(catalog_table(args.trait, everything=args.all))
        else:
            print(table(with_params=args.params))
    except (RegistryError, CatalogError, UsageError) as e:
        print(f"harness zoo {args.zoo_cmd}: {e}", file=sys.stderr)
        return USAGE_ERROR
    return 0


def _collect(args) -> int:  # noqa: ANN001
    import model_zoo
    from harness import collect, tiers
    from harness.argtypes import UsageError
    from model_zoo import catalog

    every = model_zoo.names() + catalog.candidates()
    names = every
    if args.models:
        names = [n.strip() for n in args.models.split(",")]
        unknown = [n for n in names if n not in set(every)]
        if unknown:
            raise UsageError(f"--models: not catalog candidates: {', '.join(unknown)} (see `harness zoo list --catalog --all`)")
    headline = tuple(m for m, _ in tiers.HEADLINE)
    return collect.collect(names, args.out or catalog.PATH, jobs=args.jobs, timeout=args.timeout, headline=headline)
