"""``harness report mlp-width|async|models|all``: measure (``harness.perf``), write results, render (``reports``).

Results files come first (``reports/out/<report>/results.jsonl``, ``results.csv``, ``meta.json``);
tables, plots and the page are made from them by the ``reports`` package, and ``--from DIR``
re-renders existing results without running anything.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from harness import cluster
from harness.argtypes import USAGE_ERROR, UsageError, directory, non_negative_int, positive_int, width_list
from reports.schema import PEER_BACKEND

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ("mlp-width", "async", "models")
DEFAULT_OUT = ROOT / "reports" / "out"
PUBLISHED = ROOT / "reports" / "published"
WIDTHS = "64,128,256,512,1024,2048,4096"
# Small enough that `harness report all` stays under about 20 minutes on a 2-core CPU (GPT-2 small steps
# take seconds there): MLP steps are milliseconds, so the sweep affords more of them for its spread.
DEFAULT_STEPS = {"mlp-width": 20, "async": 5, "models": 5}
# Rounds of one child per API (interleaved; each API's median round makes the row). An MLP cell's timed
# steps last milliseconds, so one slow stretch of a noisy machine moved a whole API's figure: three rounds
# cost the sweep its process starts three times. A GPT-2 small step lasts seconds: one round there.
DEFAULT_ROUNDS = {"mlp-width": 3, "models": 1}
DEFAULT_BACKENDS = {"mlp-width": ["pfvm:cpu", "mncore2:auto"], "async": ["pfvm:cpu", "mncore2:auto", "pfvm:cuda"],
                    "models": ["pfvm:cpu", "mncore2:auto"]}
MODELS = ("resnet18", "gpt2_small")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=REPORTS + ("all",), help="which report ('all': every report and the page)")
    p.add_argument("--backend", action="append",
                   help="device string, repeatable or comma-separated (pfvm:cpu, pfvm:cuda, mncore2:auto; "
                        "'DEVICE@MODE' sets the simulator mode, mncore2 defaults to performance); "
                        "default per report: " + "; ".join(f"{k}: {','.join(v)}" for k, v in DEFAULT_BACKENDS.items()))
    p.add_argument("--sim-mode", default=None, help="simulator mode for emu2/mncore2 backends (default: performance)")
    p.add_argument("--widths", type=width_list, default=WIDTHS, help=f"MLP widths (default {WIDTHS})")
    p.add_argument("--steps", type=positive_int, help="timed steps per measurement (default: " +
                   ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + ")")
    p.add_argument("--rounds", type=positive_int,
                   help="(mlp-width, models) time each API in N rounds of its own child process, interleaved, "
                        "and keep its median round (default: " +
                        ", ".join(f"{k} {v}" for k, v in DEFAULT_ROUNDS.items()) + ")")
    p.add_argument("--warmup", type=non_negative_int, default=3,
                   help="untimed steps first (compile, optimizer state, mncore.capture's 3 recordings); default 3")
    p.add_argument("--config", default="default", help="zoo config of the models (default; 'tiny' for smoke runs)")
    p.add_argument("--out", type=directory, help="root directory of the reports (default reports/out; with --from: DIR)")
    p.add_argument("--from", dest="from_dir", type=directory, help="re-render from existing results under DIR; runs nothing")
    p.add_argument("--timeout", type=positive_int, default=1500, help="seconds per measured model and backend")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="(mlp-width, models) also time each model in eager PyTorch and under torch.compile "
                        "(inductor) on the CPU, as reference rows (default: on; --no-peers skips them)")
    p.add_argument("--publish", nargs="?", const=PUBLISHED, type=directory,
                   help="('all') also copy Markdown, PNGs, CSVs to DIR (default reports/published); only files "
                        "listed in DIR's manifest (harness-manifest.json) are replaced")
    cluster.add_argument(p)


def _backends(args: argparse.Namespace, name: str) -> list:
    from harness.perf import Backend

    texts = [b for item in args.backend for b in item.split(",") if b.strip()] if args.backend \
        else DEFAULT_BACKENDS[name]
    return [Backend.parse(t, args.sim_mode) for t in texts]


def cells(name: str, args: argparse.Namespace) -> list[dict]:
    """What to measure for report ``name``: one cell per model and backend."""
    steps = args.steps or DEFAULT_STEPS[name]
    base = {"report": name, "config": args.config, "steps": steps, "warmup": args.warmup}
    out = []
    if name in DEFAULT_ROUNDS:
        base["rounds"] = args.rounds or DEFAULT_ROUNDS[name]
    for b in _backends(args, name):
        bb = {**base, "backend": b.device, "sim_mode": b.sim_mode}
        if name == "mlp-width":
            out += [{**bb, "kind": "compare", "execution": "async", "model": f"mlp_w{w}"} for w in args.widths]
        elif name == "async":
            out.append({**bb, "kind": "modes", "model": "gpt2_small", "executions": ["sync", "async_naive", "async"]})
        else:
            out += [{**bb, "kind": "compare", "execution": "async", "model": m} for m in MODELS]
    if name != "async" and getattr(args, "peers", False):  # once per model: they do not run on a backend
        models = [f"mlp_w{w}" for w in args.widths] if name == "mlp-width" else list(MODELS)
        out += [{**base, "kind": "peers", "backend": PEER_BACKEND, "sim_mode": None, "model": m} for m in models]
    return out


def measure(name: str, args: argparse.Namespace, root: Path, where: cluster.Cluster | None = None) -> Path:
    """Run report ``name``'s cells and write its results files; returns the report directory."""
    from harness import perf
    from harness.results import provenance, write_results

    d = root / name
    if d.exists():  # stale timelines/traces of an earlier run must not be mixed in
        import shutil

        for sub in ("timelines", "traces", "cells"):
            shutil.rmtree(d / sub, ignore_errors=True)
        for f in list(d.glob("*.png")) + [d / "report.md"]:
            f.unlink(missing_ok=True)
    todo = cells(name, args)
    meta = provenance()
    t0 = time.monotonic()
    print(f"harness report {name}: {len(todo)} cell(s), {todo[0]['steps'] if todo else 0} timed steps after "
          f"{args.warmup} warm-up -> {d}", flush=True)
    rows = perf.run_cells(todo, d, timeout=args.timeout, desc=name, cluster=where)
    backends = []
    for b in _backends(args, name):
        mine = [r for r in rows if r.backend == b.label]
        bad = [r for r in mine if r.status != "ok"]
        state = "ok" if not bad else (bad[0].reason if all(r.status == "unavailable" for r in mine)
                                      else f"{len(bad)} of {len(mine)} not ok")
        backends.append({"label": b.label, "device": b.device, "sim_mode": b.sim_mode, "state": state})
    if todo and "rounds" in todo[0]:
        meta["rounds"] = todo[0]["rounds"]
    meta.update(report=name, steps=todo[0]["steps"] if todo else None, warmup=args.warmup, config=args.config,
                execution="sync, async_naive, async (one row each)" if name == "async" else "async",
                backends=backends, wall_s=round(time.monotonic() - t0, 1), cluster=args.cluster.label,
                command="harness " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["report"]
                else f"harness report {name}")
    write_results(rows, d, meta)
    return d


def render(name: str, d: Path) -> None:
    from reports import page, reference, tables
    from reports.results import load, split_peers

    md = page.render_report(d, name)
    meta, every = load(d)
    df, peers = split_peers(every)
    article = reference.comparable(meta.get("config"))
    table = {"mlp-width": tables.mlp_table, "async": lambda x: tables.async_table(x, article),
             "models": lambda x: tables.models_table(x, article)}[name](df)
    print(tables.to_markdown(table))
    if len(peers):
        print(tables.to_markdown(tables.peers_table(peers, df)))
    for note in tables.unavailable(every):
        print(f"  not run: {note}")
    for note in tables.capture_notes(df):
        print(f"  captured lazy: {note}")
    for t in tables.targets(name, every):
        print(f"  target {t.what} on {t.backend} ({t.limit}): {t.value} -> {t.verdict}" + (f" [{t.note}]" if t.note else ""))
    print(f"{name}: {d / 'results.jsonl'}, {d / 'results.csv'}; report {md}", flush=True)


def main(args: argparse.Namespace) -> int:
    """Exit 0, or 2 when an input is refused (``--from`` not a directory or holding no results,
    ``--publish`` a foreign directory or nothing to publish), before anything is written there."""
    from reports import page

    names = list(REPORTS) if args.name == "all" else [args.name]
    try:
        sources = _sources(args, names) if args.from_dir is not None else {}
        if args.publish and args.name == "all":
            page.owned(args.publish)  # a foreign publish directory is refused before minutes of measuring
        if args.from_dir is None:
            cluster.check(args.cluster)
    except (UsageError, page.PublishError) as e:
        print(f"harness report: {e}", file=sys.stderr)
        return USAGE_ERROR
    root = Path(args.out or args.from_dir or DEFAULT_OUT)
    root.mkdir(parents=True, exist_ok=True)
    try:
        with cluster.connect(args.cluster if args.from_dir is None else cluster.ClusterChoice("local")) as where:
            return _reports(args, names, sources, root, where)
    except cluster.ClusterError as e:
        print(f"harness report: {e}", file=sys.stderr)
        return USAGE_ERROR


def _reports(args: argparse.Namespace, names: list[str], sources: dict[str, Path], root: Path,
             where: cluster.Cluster) -> int:
    """Measure (on ``where``) or adopt each report, render it, and for ``all`` the page (and publish)."""
    from reports import page

    for name in names:
        if args.from_dir is not None:
            src = sources.get(name)
            if src is None:
                print(f"{name}: no results under {args.from_dir} (skipped)", file=sys.stderr)
                continue
            d = src if args.out is None else root / name
            page.adopt(src, d)
        else:
            d = measure(name, args, root, where)
        render(name, d)
    if args.name == "all":
        md, html = page.render_index(root)
        print(f"page: {md} and {html}")
        if args.publish:
            try:
                written = page.publish(root, args.publish)
            except page.PublishError as e:
                print(f"harness report: {e}", file=sys.stderr)
                return USAGE_ERROR
            print(f"published {len(written)} files to {args.publish} (manifest {args.publish / page.MANIFEST})")
    return 0


def _sources(args: argparse.Namespace, names: list[str]) -> dict[str, Path]:
    """Where each report's results are under ``--from``; ``UsageError`` when the directory is missing
    or holds none of them (a mistyped ``--from`` must not render, or publish, an empty page)."""
    from reports import page

    if not args.from_dir.is_dir():
        raise UsageError(f"--from {args.from_dir}: no such directory")
    found = {name: d for name in names if (d := page.locate(args.from_dir, name)) is not None}
    if not found:
        raise UsageError(f"--from {args.from_dir}: no results of {', '.join(names)} there (nothing rendered)")
    return found
