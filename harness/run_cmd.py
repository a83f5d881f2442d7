"""``harness run --tier unit|models|full`` (and ``--tier unit --suite opinfo|modules|optim``): check the inputs, run the cells, write results as rows
finish, check or update the expectations.

Every input is checked before anything runs or is written (unknown model, config or backend, a
corrupt expectations file: one line, exit 2). SIGINT/SIGTERM stop the run: the children are killed
(``CellRunner``), the results of the finished cells are finalized, and the exit is 128 + signal.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from harness import cluster
from harness.argtypes import USAGE_ERROR, UsageError, directory, positive_int
from harness.suites.cell import SUITES

if TYPE_CHECKING:
    from harness.results import ResultsFiles


def add_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--tier", choices=("unit", "models", "full"), required=True,
                     help="unit: the fast pytest tier (or --suite); models: the headline models and the catalog's "
                          "representative set, tiny models covering every trait value (what `make run` runs); full: every zoo model and config and "
                          "every catalog model, on every backend")
    run.add_argument("--backend", help="pfvm:cpu | pfvm:cuda | emu2 | mncore2:auto, or several comma-separated "
                                       "(default: pfvm:cpu; full: pfvm:cpu, pfvm:cuda when present, emu2, mncore2:auto)")
    run.add_argument("--models", help="comma-separated names (name or name:config) to run instead of the tier's set")
    run.add_argument("--steps", type=positive_int, default=3,
                     help="training steps per mode (step time: the median after the first)")
    run.add_argument("--out", type=directory, help="results directory (default results/<timestamp>)")
    run.add_argument("--jobs", type=positive_int, default=1, help="models run in parallel (each in its own process)")
    run.add_argument("--timeout", type=positive_int, default=900, help="seconds per model")
    run.add_argument("--suite", choices=SUITES,
                     help="unit tier: run PyTorch's OpInfo database (opinfo), nn module database (modules) or "
                          "optimizer database (optim) on --backend instead of the pytest unit tests (results as rows; "
                          "see docs/conformance.md)")
    run.add_argument("--ops", help="--suite: comma-separated op or module names to run instead of the whole database")
    run.add_argument("--samples", type=positive_int, default=8, help="--suite: the first N samples of each op")
    run.add_argument("--no-backward", action="store_true", help="--suite: check forward outputs only")
    run.add_argument("--update-expected", action="store_true",
                     help="update the rows of the cells that ran in ci/expected/<tier>_<backend>.csv (others kept)")
    cluster.add_argument(run)


def _picked(args: argparse.Namespace, todo: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (model, config) pairs to run: the tier's, or ``--models`` (each name checked against the zoo)."""
    import model_zoo

    if not args.models:
        return todo
    picked: list[tuple[str, str]] = []
    for w in (w.strip() for w in args.models.split(",")):
        name, _, config = w.partition(":")
        try:
            spec = model_zoo.get(name)
        except KeyError:
            raise UsageError(f"--models: unknown model {name!r} (see `harness zoo list`)") from None
        if config and config not in spec.configs:
            raise UsageError(f"--models: {name} has no config {config!r} (it has {', '.join(spec.configs)})")
        picked += [(name, config)] if config else [(m, c) for m, c in todo if m == name] or [(name, "tiny")]
    return picked


def _backends(args: argparse.Namespace) -> list[str]:
    """``--backend`` (one, or several comma-separated), each checked; default: the tier's."""
    import mncore
    from harness import tiers

    if not args.backend:
        return tiers.available_backends() if args.tier == "full" else ["pfvm:cpu"]
    picked = [b.strip() for b in args.backend.split(",") if b.strip()]
    for b in picked:
        try:
            mncore.parse_device(b)
        except ValueError as e:
            raise UsageError(f"--backend: {e}") from None
    return picked


def main(args: argparse.Namespace) -> int:
    from harness import tiers

    if args.suite and args.tier != "unit":
        print("harness run: --suite belongs to --tier unit", file=sys.stderr)
        return USAGE_ERROR
    if args.tier == "unit" and args.suite:
        return _run_suite(args)
    if args.tier == "unit":
        return tiers.run_unit(args.jobs if args.jobs > 1 else None)
    from harness import expectations

    try:
        todo = _picked(args, tiers.models_tier() if args.tier == "models" else tiers.full_tier())
        backends = _backends(args)
        cluster.check(args.cluster)
        for b in backends:  # a corrupt file is refused now, not after the run
            expectations.load_expected(args.tier, b)
            expectations.load_perf(args.tier, b)
    except (UsageError, expectations.ExpectationsError) as e:
        print(f"harness run: {e}", file=sys.stderr)
        return USAGE_ERROR
    out = args.out or tiers.ROOT / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    return _run(args, todo, backends, out)


def _run(args: argparse.Namespace, todo: list[tuple[str, str]], backends: list[str], out: Path) -> int:
    from harness import expectations, tiers
    from harness.interrupt import Interrupted, signals_raise
    from harness.results import ResultsWriter
    from reports import run_summary

    meta = tiers.metadata(args.tier, args.steps)
    print(f"harness: tier {args.tier}: {len(todo)} model configs x {len(backends)} backend(s), {args.steps} steps "
          f"each on {args.cluster.label} -> {out}", flush=True)
    writer = ResultsWriter(out, {**meta, "cluster": args.cluster.label}, stamp=True)
    stopped: Interrupted | None = None
    with signals_raise():
        try:
            with cluster.connect(args.cluster, args.jobs) as where:
                tiers.run_models(todo, backends, args.steps, out, jobs=args.jobs, timeout=args.timeout,
                                 on_row=writer.add, cluster=where, fork=args.tier == "full")
        except Interrupted as e:  # the children are already killed (CellRunner.run), the Ray tasks cancelled
            stopped = e
        except cluster.ClusterError as e:
            writer.close(cluster_error=str(e))
            print(f"harness run: {e}", file=sys.stderr)
            return USAGE_ERROR
    records = [r.to_json() for r in writer.rows]
    if stopped is not None:
        note = (f"interrupted by {stopped.name} after {len(records)} of {len(todo) * len(backends)} cells: "
                "the results hold the finished ones; expectations not checked or updated")
        files = writer.close(interrupted=stopped.name)
        md, html = run_summary.write(out, records, json.loads(files.meta.read_text()), {}, {}, [], _names(files), note)
        print(f"harness run: {note} ({files.jsonl}, {files.csv}, {md}, {html})", file=sys.stderr)
        return stopped.exit_code
    files = writer.close()
    problems: list[str] = []
    judged: dict[run_summary.Key, list[str]] = {}
    perf: dict[run_summary.Key, str] = {}
    refresh = f"harness run --tier {args.tier} --update-expected" + (f" --backend {args.backend}" if args.backend else "")
    for b in backends:
        b_rows = [r for r in records if r["backend"] == b]
        if args.update_expected:
            whole = not args.models  # the whole tier ran: rows of models no longer in it go
            for path in expectations.update(b_rows, args.tier, b, keep_others=not whole):
                print(f"updated {len(b_rows)} row(s) of {expectations.shown(path)} "
                      f"({'the rest dropped: the whole tier ran' if whole else 'others kept'})")
        else:
            found = expectations.check(b_rows, args.tier, b)
            if args.models:  # a partial run only checks the rows it ran
                found = [p for p in found if not p.endswith("expected but not run")]
            problems += found
        judged |= {(m, c, b): d for (m, c), d in expectations.judge(b_rows, args.tier, b).items()}
        perf |= {(m, c, b): t for (m, c), t in expectations.perf_changes(b_rows, args.tier, b).items()}
    closed = json.loads(files.meta.read_text())  # the provenance with the load at the end
    md, html = run_summary.write(out, records, closed, judged, perf, problems, _names(files))
    print(f"\nharness run --tier {args.tier} on {', '.join(backends)}: {run_summary.headline(records, judged)}")
    print(run_summary.to_text(run_summary.status_table(records, judged, perf)))
    baselines = ", ".join(expectations.shown(expectations.perf_path(args.tier, b)) for b in backends)
    print(f"modes: eager (reference, CPU), lazy, captured (lazy + mncore.capture), Context (Context API); "
          f"expectations: vs {', '.join(expectations.shown(expectations.expected_path(args.tier, b)) for b in backends)}; "
          f"vs baseline: step time vs {baselines}, informational (under 10 % is noise; "
          f"{run_summary.load(closed)}); the legend and every figure are in the summary")
    print(f"results: {files.jsonl} and {files.csv}; summary: {md}; page: {html}")
    if problems:
        print("expected-results mismatches (regressions and unexpected improvements):", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        print(f"if these changes are intended, refresh the expectations with: {refresh}", file=sys.stderr)
        return 1
    return 0


def _names(files: ResultsFiles) -> dict[str, str]:
    """The results files as the page lists them."""
    return {"every field": files.jsonl.name, "scalars": files.csv.name, "provenance": files.meta.name}


def _run_suite(args: argparse.Namespace) -> int:
    """``--tier unit --suite S``: the database's ops on one backend as rows, judged by the expected failures."""
    from harness import tiers
    from harness.interrupt import Interrupted, signals_raise
    from harness.results import ResultsWriter
    from harness.suites import run as suite_run

    try:
        backend = _backends(args)[0]
        everything = suite_run.names(args.suite)
        todo = [n.strip() for n in args.ops.split(",")] if args.ops else everything
        unknown = [n for n in todo if n not in everything]
        if unknown:
            raise UsageError(f"--ops: not in the {args.suite} database: {', '.join(unknown)}")
    except UsageError as e:
        print(f"harness run: {e}", file=sys.stderr)
        return USAGE_ERROR
    out = args.out or tiers.ROOT / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    meta = {**tiers.metadata("unit", 0), "suite": args.suite, "samples_cap": args.samples,
            "checks": "forward" if args.no_backward else "forward+backward"}
    print(f"harness: suite {args.suite}: {len(todo)} ops on {backend}, first {args.samples} samples each, "
          f"{meta['checks']} -> {out}", flush=True)
    writer = ResultsWriter(out, meta, stamp=True)
    with signals_raise():
        try:
            rows = suite_run.run_suite(args.suite, todo, backend, out, cap=args.samples, backward=not args.no_backward,
                                       jobs=args.jobs, timeout=args.timeout * 4, on_row=writer.add)
        except Interrupted as e:
            files = writer.close(interrupted=e.name)
            print(f"harness run: interrupted by {e.name} after {len(writer.rows)} of {len(todo)} ops ({files.jsonl})",
                  file=sys.stderr)
            return e.exit_code
    rates = suite_run.pass_rates(rows)
    files = writer.close(**rates)
    (out / "pass_rates.json").write_text(json.dumps({"backend": backend, **meta, **rates}, indent=1))
    problems = suite_run.problems(rows)
    print(f"{args.suite} on {backend}: {rates['ops_pass']}/{rates['ops']} ops pass ({rates['ops_pass_pct']} %), "
          f"{rates['samples_pass']}/{rates['samples']} samples ({rates['samples_pass_pct']} %); "
          f"results: {files.jsonl}, {files.csv}, {out / 'pass_rates.json'}")
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} unexpected result(s): fix them, or list a failure with its category and reason in "
              "ci/expected_op_failures.json (a passing op's entry must be removed)", file=sys.stderr)
    return 1 if problems else 0
