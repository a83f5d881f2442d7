"""The ``harness`` command."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import cluster
from harness.argtypes import USAGE_ERROR, HelpFormatter, command, non_negative_int, positive_int


def _version() -> str:
    """mncore's version from its package metadata (the same source as ``mncore.__version__``; no torch import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mncore")
    except PackageNotFoundError:  # a checkout run without `pip install -e .`
        return "unknown (not installed: run `make install`)"


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (every subcommand's ``--help`` shows its defaults and an example)."""
    ap = argparse.ArgumentParser(prog="harness", description="mncore benchmark and conformance harness",
                                 formatter_class=HelpFormatter,
                                 epilog="examples:\n  harness run --tier models        # what `make run` does\n"
                                        "  harness <command> --help         # each command's options and an example")
    ap.add_argument("--version", action="version", version=f"%(prog)s (mncore) {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    from harness import run_cmd

    run_cmd.add_arguments(command(sub, "run", "run a regression tier (eager vs lazy vs captured lazy vs Context API)",
                                  "harness run --tier models --models mlp_w64,llama:tiny --out /tmp/run"))

    zoo = command(sub, "zoo", "the model zoo", "harness zoo list --catalog --trait task=masked-lm")
    zoo_sub = zoo.add_subparsers(dest="zoo_cmd", required=True, metavar="ZOO_COMMAND")
    zl = command(zoo_sub, "list", "models and their traits", "harness zoo list --params")
    zl.add_argument("--params", action="store_true", help="also count tiny-config parameters (builds each model)")
    zl.add_argument("--catalog", action="store_true", help="the catalog's models (model_zoo/catalog/catalog.jsonl)")
    zl.add_argument("--trait", action="append", default=[], metavar="K=V",
                    help="only catalog models with trait K having value V (repeatable; implies --catalog)")
    zl.add_argument("--all", action="store_true", help="with --catalog: the excluded candidates too, with why")
    command(zoo_sub, "traits", "every catalog trait value, the models having it and the representative set",
            "harness zoo traits")
    zc = command(zoo_sub, "collect", "build every catalog candidate, train it a step, write the catalog file",
                 "harness zoo collect --models hf_llama,hf_bert --jobs 2")
    zc.add_argument("--models", help="comma-separated candidates to (re)collect (default: all; others are kept)")
    zc.add_argument("--jobs", type=positive_int, default=1, help="candidates built in parallel (own process each)")
    zc.add_argument("--timeout", type=positive_int, default=300, help="seconds per candidate")
    zc.add_argument("--out", type=Path, default=None, help="catalog file (default model_zoo/catalog/catalog.jsonl)")

    reg = command(sub, "registry", "the shape registry", "harness registry show --op aten.addmm --limit 5")
    reg_sub = reg.add_subparsers(dest="reg_cmd", required=True, metavar="REGISTRY_COMMAND")
    rr = command(reg_sub, "record", "train zoo models a step each and record their ops",
                 "harness registry record --models mlp_w64,llama --configs tiny --jobs 2")
    rr.add_argument("--models", help="comma-separated zoo names (default: all)")
    rr.add_argument("--catalog", action="store_true",
                    help="every catalog model that built (tiny configs; `harness zoo list --catalog`), with --models "
                         "too; the rows of models not re-recorded are kept")
    rr.add_argument("--recipes", action="store_true",
                    help="every training recipe (optimizers, clipping, losses, layers: model_zoo/recipes.py; tiny "
                         "configs), with --models and --catalog too")
    rr.add_argument("--configs", default="tiny,default", help="comma-separated zoo configs recorded per model")
    rr.add_argument("--resume", action="store_true",
                    help="skip the model configs the registry file already holds (finish an interrupted run)")
    rr.add_argument("--out", type=Path, default=None,
                    help="registry file (default shape_registry/data/registry.jsonl)")
    rr.add_argument("--jobs", type=positive_int, default=1, help="models recorded in parallel (own process each)")
    rr.add_argument("--timeout", type=positive_int, default=1800, help="seconds per model")
    rr.add_argument("--no-lazy", action="store_true", help="record eager CPU only")
    rr.add_argument("--max-batch", type=non_negative_int, default=2,
                    help="cap the batch size of non-tiny configs (every op and non-batch dim is unchanged; "
                         "0 = the spec's own batch size)")
    cluster.add_argument(rr)
    for name, what, example in (("stats", "counts of the registry's ops, models and rows", "harness registry stats"),
                                ("show", "the registry's rows of an op or a model",
                                 "harness registry show --model gpt2_small:tiny --limit 20")):
        p = command(reg_sub, name, what, example)
        p.add_argument("--path", type=Path, default=None, help="registry file (default shape_registry/data/registry.jsonl)")
        if name == "show":
            p.add_argument("--op", help="e.g. aten.addmm or aten.addmm.default")
            p.add_argument("--model", help="zoo model name (optionally name:config)")
            p.add_argument("--limit", type=positive_int, default=50, help="rows shown at most")
    from harness import report_cmd

    report_cmd.add_arguments(command(sub, "report", "performance reports (MLP width sweep, async modes, models)",
                                     "harness report all --from reports/published --out /tmp/page"))
    from harness.fuzz import add_arguments as fuzz_arguments

    fuzz_arguments(command(sub, "fuzz", "registry-driven fuzzing of mncore against eager PyTorch",
                           "harness fuzz --seconds 60 --seed 1 --ops 'aten.mul*,aten.add.Tensor'"))
    return ap


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = build_parser()
    args = ap.parse_args(argv)

    if args.cmd == "run":
        from harness import run_cmd

        return run_cmd.main(args)
    if args.cmd == "report":
        from harness import report_cmd

        return report_cmd.main(args)
    if args.cmd == "fuzz":
        from harness.fuzz.campaign import main as fuzz_main

        return fuzz_main(args)
    if args.cmd == "zoo":
        from harness.zoo_cmd import main as zoo_main

        return zoo_main(args)
    from harness import registry_cmd

    path = getattr(args, "path", None) or getattr(args, "out", None) or registry_cmd.DEFAULT_PATH
    if args.reg_cmd == "record":
        import model_zoo

        models = args.models.split(",") if args.models else [] if args.catalog or args.recipes else model_zoo.names()
        for m in models:
            model_zoo.get(m)  # unknown names fail before any work starts
        cells = [(m, c) for m in models for c in args.configs.split(",")]
        if args.catalog:
            from model_zoo import catalog

            cells += [(e.name, "tiny") for e in catalog.built() if e.source != "zoo" and e.name not in models]
        if args.recipes:
            from model_zoo import recipes

            cells += [(r, "tiny") for r in recipes.candidates() if r not in models]
        if args.resume and path.exists():
            from shape_registry import Registry

            held = Registry.load(path).models
            print(f"--resume: {sum(f'{m}:{c}' in held for m, c in cells)} of {len(cells)} model configs already recorded")
            cells = [(m, c) for m, c in cells if f"{m}:{c}" not in held]
        try:
            with cluster.connect(args.cluster, args.jobs) as where:
                return registry_cmd.record(cells, path, jobs=args.jobs, timeout=args.timeout,
                                           lazy=not args.no_lazy, max_batch=args.max_batch or None, cluster=where)
        except cluster.ClusterError as e:
            print(f"harness registry record: {e}", file=sys.stderr)
            return USAGE_ERROR
    if args.reg_cmd == "stats":
        print(registry_cmd.stats(path))
        return 0
    print(registry_cmd.show(path, args.op, args.model, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
