"""The ``harness`` command."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = argparse.ArgumentParser(prog="harness", description="mncore benchmark and conformance harness")
    sub = ap.add_subparsers(dest="cmd", required=True)

    zoo = sub.add_parser("zoo", help="the model zoo").add_subparsers(dest="zoo_cmd", required=True)
    zl = zoo.add_parser("list", help="models and their traits")
    zl.add_argument("--params", action="store_true", help="also count tiny-config parameters (builds each model)")

    reg = sub.add_parser("registry", help="the shape registry").add_subparsers(dest="reg_cmd", required=True)
    rr = reg.add_parser("record", help="train zoo models a step each and record their ops")
    rr.add_argument("--models", help="comma-separated zoo names (default: all)")
    rr.add_argument("--configs", default="tiny,default")
    rr.add_argument("--out", type=Path, default=None)
    rr.add_argument("--jobs", type=int, default=1)
    rr.add_argument("--timeout", type=int, default=1800, help="seconds per model")
    rr.add_argument("--no-lazy", action="store_true", help="record eager CPU only")
    for name in ("stats", "show"):
        p = reg.add_parser(name)
        p.add_argument("--path", type=Path, default=None)
        if name == "show":
            p.add_argument("--op", help="e.g. aten.addmm or aten.addmm.default")
            p.add_argument("--model", help="zoo model name (optionally name:config)")
            p.add_argument("--limit", type=int, default=50)
    args = ap.parse_args(argv)

    if args.cmd == "zoo":
        from harness.zoo_cmd import table

        print(table(with_params=args.params))
        return 0
    from harness import registry_cmd

    path = getattr(args, "path", None) or getattr(args, "out", None) or registry_cmd.DEFAULT_PATH
    if args.reg_cmd == "record":
        import model_zoo

        models = args.models.split(",") if args.models else model_zoo.names()
        for m in models:
            model_zoo.get(m)  # unknown names fail before any work starts
        return registry_cmd.record(models, args.configs.split(","), path, jobs=args.jobs, timeout=args.timeout,
                                   lazy=not args.no_lazy)
    if args.reg_cmd == "stats":
        print(registry_cmd.stats(path))
        return 0
    print(registry_cmd.show(path, args.op, args.model, args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
