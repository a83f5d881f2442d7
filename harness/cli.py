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

    run = sub.add_parser("run", help="run a regression tier (eager vs lazy vs Context API)")
    run.add_argument("--tier", choices=("unit", "models", "full"), required=True)
    run.add_argument("--backend", help="pfvm:cpu | pfvm:cuda (default: pfvm:cpu; full: every available one)")
    run.add_argument("--models", help="comma-separated names (name or name:config) to run instead of the tier's set")
    run.add_argument("--steps", type=int, default=3)
    run.add_argument("--out", type=Path, help="results directory (default results/<timestamp>)")
    run.add_argument("--jobs", type=int, default=1, help="models run in parallel (each in its own process)")
    run.add_argument("--timeout", type=int, default=900, help="seconds per model")
    run.add_argument("--update-expected", action="store_true", help="rewrite ci/expected/<tier>_<backend>.csv")

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
    rr.add_argument("--max-batch", type=int, default=2,
                    help="cap the batch size of non-tiny configs (every op and non-batch dim is unchanged; "
                         "0 = the spec's own batch size)")
    for name in ("stats", "show"):
        p = reg.add_parser(name)
        p.add_argument("--path", type=Path, default=None)
        if name == "show":
            p.add_argument("--op", help="e.g. aten.addmm or aten.addmm.default")
            p.add_argument("--model", help="zoo model name (optionally name:config)")
            p.add_argument("--limit", type=int, default=50)
    from harness import report_cmd

    report_cmd.add_arguments(sub.add_parser("report", help="performance reports (MLP width sweep, async modes, models)"))
    from harness.fuzz import add_arguments as fuzz_arguments

    fuzz_arguments(sub.add_parser("fuzz", help="registry-driven fuzzing of mncore against eager PyTorch"))
    args = ap.parse_args(argv)

    if args.cmd == "run":
        return _run(args)
    if args.cmd == "report":
        return report_cmd.main(args)
    if args.cmd == "fuzz":
        from harness.fuzz.campaign import main as fuzz_main

        return fuzz_main(args)
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
                                   lazy=not args.no_lazy, max_batch=args.max_batch or None)
    if args.reg_cmd == "stats":
        print(registry_cmd.stats(path))
        return 0
    print(registry_cmd.show(path, args.op, args.model, args.limit))
    return 0


def _run(args: argparse.Namespace) -> int:
    from harness import tiers

    if args.tier == "unit":
        return tiers.run_unit(args.jobs if args.jobs > 1 else None)
    todo = tiers.models_tier() if args.tier == "models" else tiers.full_tier()
    if args.models:
        picked: list[tuple[str, str]] = []
        for w in args.models.split(","):
            if ":" in w:
                picked.append(tuple(w.split(":", 1)))  # type: ignore[arg-type]
            else:
                picked += [(m, c) for m, c in todo if m == w] or [(w, "tiny")]
        todo = picked
    backends = [args.backend] if args.backend else (tiers.available_backends() if args.tier == "full" else ["pfvm:cpu"])
    out = args.out or tiers.ROOT / "results" / __import__("datetime").datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    meta = tiers.metadata(args.tier, args.steps)
    print(f"harness: tier {args.tier}: {len(todo)} model configs x {len(backends)} backend(s), {args.steps} steps "
          f"each -> {out}", flush=True)
    from harness.results import write_results

    rows = tiers.run_models(todo, backends, args.steps, out, jobs=args.jobs, timeout=args.timeout)
    files = write_results(rows, out, meta, stamp=True)
    records = [r.to_json() for r in rows]
    print(tiers.summary_table(records))
    problems: list[str] = []
    refresh = f"harness run --tier {args.tier} --update-expected" + (f" --backend {args.backend}" if args.backend else "")
    for b in backends:
        b_rows = [r for r in records if r["backend"] == b]
        if args.update_expected:
            for path in tiers.write_expected(b_rows, args.tier, b):
                print(f"wrote {path.relative_to(tiers.ROOT)}")
            continue
        found = tiers.check_expected(b_rows, args.tier, b)
        if args.models:  # a partial run only checks the rows it ran
            found = [p for p in found if not p.endswith("expected but not run")]
        problems += found
        for line in tiers.perf_report(b_rows, tiers.perf_path(args.tier, b)):
            print("perf: " + line)
    (out / "summary.md").write_text(tiers.markdown_summary(records, meta, problems))
    print(f"results: {files.jsonl} and {files.csv}; summary: {out / 'summary.md'}")
    if problems:
        print("expected-results mismatches (regressions and unexpected improvements):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        print(f"if these changes are intended, refresh the expectations with: {refresh}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
