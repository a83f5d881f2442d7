"""The fuzzing loop: generate, run isolated, record, and for each new failure confirm, shrink, write a repro.

Output (``--out``, new or empty; default a fresh ``fuzz/<timestamp>/``): ``campaign.json`` (what
decides the cases: seed, ops, backend, plugin, ...), ``results.jsonl`` (one line per case, written as
the campaign runs), ``findings/`` (one repro per distinct signature) and ``summary.json`` (written
last, from the same counters). ``worker.log`` collects the workers' stdout/stderr. An earlier
campaign's directory is never overwritten: ``--resume DIR`` continues it with its next cases. With
``--cluster`` (Ray) the workers run on the cluster, ``--jobs`` at once (``harness.fuzz.on_cluster``),
writing the same files.
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import signal
import sys
import textwrap
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import torch

from harness import cluster, expected
from harness.argtypes import USAGE_ERROR, UsageError
from harness.fuzz import BASELINE, DEFAULT_ROOT, heap_check
from harness.fuzz.baseline import load as load_baseline
from harness.fuzz.baseline import lookup as baseline_entry
from harness.fuzz.cases import Case, tensor_specs
from harness.fuzz.findings import Findings, signature
from harness.fuzz.mutate import generate, seed_rows
from harness.fuzz.shrink import shrink
from harness.fuzz.worker import Worker, WorkerSetupError
from harness.interrupt import Interrupted, check, deferred, signals_raise
from harness.registry_cmd import DEFAULT_PATH
from shape_registry import Registry

REPRODUCIBILITY = ("case i depends only on (seed, i, the --ops selection, --max-numel, the registry): the same seed "
                   "and --cases give the same cases; a --seconds budget only changes how many of them run")


@dataclass
class Config:
    seconds: float = 60.0
    seed: int = 0
    cases: int | None = None
    ops: str | None = None
    backend: str = "pfvm:cpu"
    out: Path = DEFAULT_ROOT
    plugin: str | None = None
    case_timeout: float = 20.0
    shrink_seconds: float = 20.0
    max_numel: int = 1 << 16
    registry: Path | None = None
    baseline: Path = BASELINE  # known findings that do not fail the run (not part of the identity)
    progress: bool = True
    resume: bool = False  # continue the campaign in ``out`` (its campaign.json decides the cases)
    cluster: str = "local"  # where the workers run (``--cluster``'s label; not part of the identity)
    jobs: int = 1  # workers at once (on a cluster)
    malloc_check: bool = False  # workers under glibc's checking allocator (harness.fuzz.heap_check)

    IDENTITY = ("seed", "ops", "backend", "plugin", "max_numel", "registry")  # what decides case i and its verdict

    def identity(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items() if k in self.IDENTITY}

    def command(self) -> str:
        parts = ["harness fuzz", f"--seconds {self.seconds:g}", f"--seed {self.seed}"]
        for flag, v in (("--cases", self.cases), ("--ops", self.ops), ("--plugin", self.plugin)):
            if v is not None:
                parts.append(f"{flag} '{v}'" if flag == "--ops" else f"{flag} {v}")
        if self.backend != "pfvm:cpu":
            parts.append(f"--backend {self.backend}")
        if self.malloc_check:
            parts.append("--malloc-check")
        return " ".join(parts)


@dataclass
class Stats:
    """Counters the summary is made of (all from cases that ran)."""
    outcomes: Counter = field(default_factory=Counter)
    categories: Counter = field(default_factory=Counter)
    checks: dict[str, Counter] = field(default_factory=dict)
    ops: Counter = field(default_factory=Counter)
    failures: dict[str, dict] = field(default_factory=dict)
    flaky: dict[str, dict] = field(default_factory=dict)
    known: dict[str, dict] = field(default_factory=dict)  # findings the baseline lists: counted, not shrunk

    def add_known(self, sig: str, index: int, reason: str) -> None:
        entry = self.known.setdefault(sig, {"count": 0, "first_case": index, "reason": reason})
        entry["count"] += 1
        entry["first_case"] = min(entry["first_case"], index)  # a cluster's shards end in any order
    case_s: float = 0.0
    shrink_s: float = 0.0

    def add(self, case: Case, res: dict) -> None:
        self.outcomes[res["status"]] += 1
        self.categories[res.get("category", "valid")] += 1
        self.ops[case.op] += 1
        for oracle, verdict in res.get("checks", {}).items():
            self.checks.setdefault(oracle, Counter())[verdict.split(":")[0]] += 1
        self.case_s += res.get("timings", {}).get("case", 0.0)


def select_rows(cfg: Config) -> dict[str, list]:
    """Seed rows per op for ``cfg`` (rows listed in ci/expected_op_failures.json are left out)."""
    path = cfg.registry or DEFAULT_PATH
    known = expected.load()
    rows = seed_rows(Registry.load(path).sorted(), cfg.ops, cfg.max_numel,
                     skip=lambda e: any(x.matches(e.op, {t["dtype"] for t in e.tensors()}, cfg.backend) for x in known))
    if not rows:
        raise ValueError(f"--ops {cfg.ops!r} matches no op of the shape registry {path}")
    return rows


def plan(cfg: Config, n: int) -> list[Case]:
    """The first ``n`` cases a campaign with ``cfg`` runs (whatever its time budget)."""
    rows = select_rows(cfg)
    return [generate(rows, cfg.seed, i, cfg.max_numel) for i in range(n)]


def _known_failure(case: Case, backend: str, known: list) -> bool:
    entry = case.entry()
    dtypes = {s["dtype"] for _, s in tensor_specs(entry.args, entry.kwargs)}
    return any(x.matches(case.op, dtypes, backend) for x in known)


def judge(case: Case, res: dict, backend: str, known: list, baseline: list) -> str | None:
    """``res``'s signature when it is a failure (None otherwise); one listed in ``known``
    (ci/expected_op_failures.json) becomes ``xfail`` (no signature), one in ``baseline`` ``known``."""
    sig = signature(case.op, res)
    if sig and _known_failure(case, backend, known):
        res["status"], sig = "xfail", None
    elif sig and (entry := baseline_entry(baseline, sig, str(res.get("message", "")))):
        res["status"], res["baseline"] = "known", entry.reason  # judged not a bug
    return sig


def confirm(case: Case, sig: str, worker: Worker, shrink_seconds: float) -> dict:
    """Re-run ``case`` in a fresh worker and, when it fails again as ``sig``, shrink it and confirm the
    shrunk case in a fresh worker: ``{"small", "final", "info"}``; else ``{"rerun": status}`` (flaky).
    The worker is fresh again after (the next cases see nothing of this one)."""
    worker.restart()
    again = worker.run(case.to_json())
    if signature(case.op, again) != sig:
        worker.restart()
        return {"rerun": again.get("status")}
    small, info = shrink(case, sig, lambda c: worker.run(c.to_json()), shrink_seconds)
    final = again
    if small is not case:
        worker.restart()
        final = worker.run(small.to_json())
        if signature(small.op, final) != sig:  # only reproduced after earlier attempts: keep the original
            small, final, info["fallback"] = case, again, "shrunk case did not reproduce in a fresh worker"
    worker.restart()
    return {"small": small, "final": final, "info": info}


class Campaign:
    """One ``harness fuzz`` run: the loop, the counters and the output files."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.out = Path(cfg.out).resolve()  # repro paths in the summary work from any directory
        self.stats = Stats()
        self.baseline = load_baseline(cfg.baseline)  # a bad file is refused before the worker starts
        self.meta = {"seed": cfg.seed, "backend": cfg.backend, "plugin": cfg.plugin, "command": cfg.command(),
                     "case_timeout": cfg.case_timeout, "malloc_check": cfg.malloc_check, "torch": torch.__version__}

    def run(self, where: cluster.Cluster | None = None) -> dict:
        """The campaign here (one worker, the cases in order), or on ``where`` (``cfg.jobs`` shards at once:
        ``harness.fuzz.on_cluster``); the same cases and findings either way."""
        if where is not None:
            from harness.fuzz.on_cluster import run_on

            return run_on(self, where)
        cfg, t_start = self.cfg, time.monotonic()
        worker = Worker(cfg.backend, cfg.plugin, self.out / "worker.log", cfg.case_timeout,
                        malloc_check=cfg.malloc_check)
        worker.prepare()
        known = expected.load()
        rows = select_rows(cfg)
        self.out.mkdir(parents=True, exist_ok=True)
        done = self.earlier_cases() if cfg.resume else set()
        (self.out / "campaign.json").write_text(json.dumps(cfg.identity(), indent=1) + "\n")
        findings = Findings(self.out)
        worker.start()
        startup_s = time.monotonic() - t_start
        t_fuzz = time.monotonic()
        deadline = t_fuzz + cfg.seconds
        bar = _Bar(cfg.cases, cfg.progress)
        todo = (i for i in itertools.count() if i not in done)
        new = 0
        stopped: Interrupted | None = None
        try:
            with signals_raise(), (self.out / "results.jsonl").open("a") as results:
                while (cfg.cases is None or new < cfg.cases) and time.monotonic() < deadline:
                    check()
                    n = next(todo)
                    case = generate(rows, cfg.seed, n, cfg.max_numel)
                    res = worker.run(case.to_json())
                    with deferred():  # a signal now would leave the case counted but not written
                        sig = self.record(results, case, res, known)
                        new += 1
                    if sig and res["status"] != "known":
                        self._failure(sig, case, res, worker, findings)
                    bar.update(new, time.monotonic() - t_fuzz, len(self.stats.failures))
        except Interrupted as e:  # Ctrl-C or SIGTERM: the cases that ended are in the results; summarize them
            stopped = e
        finally:
            bar.close()
            worker.close()
        elapsed = time.monotonic() - t_start
        summary = self.summary(len(done) + new, new, elapsed, time.monotonic() - t_fuzz, startup_s, rows, worker.starts,
                               interrupted=stopped and stopped.name)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        return summary

    def record(self, results: IO[str], case: Case, res: dict, known: list) -> str | None:
        """Judge case ``case.index``'s outcome (an expected failure, a baseline finding), count it and write
        its line; returns its signature when it is a failure (None otherwise)."""
        sig = judge(case, res, self.cfg.backend, known, self.baseline)
        if res["status"] == "known":
            self.stats.add_known(sig, case.index, res["baseline"])
        self.stats.add(case, res)
        results.write(json.dumps({"index": case.index, "op": case.op, "describe": case.describe(), "signature": sig,
                                  **res, "case": case.to_json()}, default=str) + "\n")
        results.flush()
        return sig

    def earlier_cases(self) -> set[int]:
        """Counters, failures and flaky signatures of the campaign so far; returns the indices it ran (a
        prefix, unless a cluster's shard was lost or interrupted: the next cases fill the gaps first)."""
        path = self.out / "results.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        for line in lines:
            self.stats.add(Case.from_json(line["case"]), line)
            if line["status"] == "known":
                self.stats.add_known(line["signature"], line["index"], line.get("baseline", ""))
        summary = self.out / "summary.json"
        if summary.exists():
            before = json.loads(summary.read_text())
            self.stats.failures, self.stats.flaky = before.get("failures", {}), before.get("flaky", {})
        seen = Counter(line["signature"] for line in lines if line.get("signature") and line["status"] != "known")
        for sig, count in seen.items():  # a campaign stopped before its summary: counted, not shrunk again
            if sig not in self.stats.failures and sig not in self.stats.flaky:
                line = next(line for line in lines if line.get("signature") == sig)
                self.stats.failures[sig] = {"count": count, "first_case": line["index"], "kind": line.get("kind"),
                                            "oracle": line.get("oracle"), "message": str(line.get("message", ""))[:1000],
                                            "repro": str(self.out / "findings")}
        return {line["index"] for line in lines}

    def _failure(self, sig: str, case: Case, res: dict, worker: Worker, findings: Findings) -> None:
        """First sighting of ``sig``: confirm it in a fresh worker, shrink it, write the repro."""
        known = self.stats.failures.get(sig) or self.stats.flaky.get(sig)
        if known is not None:
            known["count"] += 1
            return
        t0 = time.monotonic()
        self.book(sig, case, res, confirm(case, sig, worker, self.cfg.shrink_seconds), findings)
        self.stats.shrink_s += time.monotonic() - t0

    def book(self, sig: str, case: Case, res: dict, outcome: dict, findings: Findings, count: int = 1) -> None:
        """Enter ``sig`` (first seen in ``case``, ``count`` times so far) as flaky or, confirmed, as a
        failure with its shrunk repro written (``outcome``: what ``confirm`` found)."""
        if "small" not in outcome:
            self.stats.flaky[sig] = {"count": count, "first_case": case.index, "message": res.get("message", ""),
                                     "rerun": outcome["rerun"]}
            return
        small, final, info = outcome["small"], outcome["final"], outcome["info"]
        script = findings.write(sig, case, small, final, info, self.meta)
        self.stats.failures[sig] = {
            "count": count, "first_case": case.index, "kind": res["kind"], "oracle": res["oracle"],
            "category": res.get("category"), "message": str(final.get("message", ""))[:1000],
            "repro": str(script), "original_numel": case.numel(), "shrunk_numel": small.numel(),
            "original_size": list(case.size_key()), "shrunk_size": list(small.size_key()),
            "shrunk": small.describe(), "shrink": info,
        }

    def summary(self, n: int, new: int, elapsed: float, fuzz_s: float, startup_s: float, rows: dict,
                worker_starts: int, lost: list | None = None, interrupted: str | None = None) -> dict:
        """``summary.json``: ``n`` cases in all, ``new`` of them this session; ``lost``: the cells of a campaign
        on a cluster that ended without a result; ``interrupted``: the signal that stopped it."""
        s = self.stats
        return {
            **{k: v for k, v in self.meta.items() if k != "case_timeout"},
            "python": platform.python_version(),
            "ops_pattern": self.cfg.ops,
            "registry": str(self.cfg.registry or DEFAULT_PATH),
            "seed_ops": len(rows), "seed_rows": sum(len(v) for v in rows.values()),
            "budget": {"seconds": self.cfg.seconds, "cases": self.cfg.cases, "case_timeout": self.cfg.case_timeout,
                       "shrink_seconds": self.cfg.shrink_seconds, "max_numel": self.cfg.max_numel},
            "reproducibility": REPRODUCIBILITY,
            "cases_run": n,
            "elapsed_s": round(elapsed, 2), "startup_s": round(startup_s, 2), "fuzz_s": round(fuzz_s, 2),
            "case_s": round(s.case_s, 2), "shrink_s": round(s.shrink_s, 2),
            "cases_per_second": round(new / fuzz_s, 2) if fuzz_s > 0 else 0.0,
            "cases_per_second_note": "this session's cases / fuzz_s; fuzz_s includes confirming and shrinking findings",
            "ops_covered": sorted(s.ops), "n_ops_covered": len(s.ops), "cases_per_op": dict(sorted(s.ops.items())),
            "outcomes": dict(s.outcomes), "categories": dict(s.categories),
            "checks": {k: dict(v) for k, v in sorted(s.checks.items())},
            "distinct_failures": len(s.failures),
            "failures": s.failures, "flaky": s.flaky,
            "baseline": str(self.cfg.baseline), "known": s.known,
            "worker_starts": worker_starts, "cluster": self.cfg.cluster, "workers": self.cfg.jobs,
            "lost": lost or [], "interrupted": interrupted,
        }


class _Bar:
    """tqdm on a terminal; a line every 10 s otherwise (CI logs)."""

    def __init__(self, total: int | None, enabled: bool):
        self.enabled, self.last = enabled, 0.0
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="case", desc="fuzz")

    def update(self, n: int, seconds: float, failures: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n - self.bar.n)
            self.bar.set_postfix(failures=failures, rate=f"{n / max(seconds, 1e-9):.1f}/s")
        elif seconds - self.last >= 10:
            self.last = seconds
            print(f"[fuzz {seconds:5.0f}s] {n} cases ({n / seconds:.1f}/s), {failures} distinct failures",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def campaign_dir(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Where this campaign writes, and the settings a resumed one keeps: ``--resume DIR`` (an earlier
    campaign's directory), ``--out DIR`` (new or empty) or a fresh ``fuzz/<timestamp>/``."""
    if args.resume is not None:
        saved = args.resume / "campaign.json"
        if not saved.exists():
            raise UsageError(f"--resume {args.resume}: no campaign.json there (not a harness fuzz campaign)")
        return args.resume, json.loads(saved.read_text())
    if args.out is not None:
        if args.out.exists() and any(args.out.iterdir()):
            raise UsageError(f"--out {args.out} is not empty (an earlier campaign?): continue it with --resume "
                             f"{args.out}, or choose a new directory")
        return args.out, {}
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out, k = DEFAULT_ROOT / stamp, 1
    while out.exists():  # two campaigns started in the same second
        out, k = DEFAULT_ROOT / f"{stamp}-{k}", k + 1
    return out, {}


def main(args: argparse.Namespace) -> int:
    """``harness fuzz``: run a campaign, print where its results are; exit 1 if it found failures, 2 on bad options."""
    try:
        out, saved = campaign_dir(args)
    except UsageError as e:
        print(f"harness fuzz: {e}", file=sys.stderr)
        return USAGE_ERROR
    chosen = dict(seed=args.seed, ops=args.ops, backend=args.backend, plugin=args.plugin, max_numel=args.max_numel,
                  registry=args.registry)
    chosen.update({k: Path(v) if k == "registry" and v else v for k, v in saved.items() if k in Config.IDENTITY})
    if args.jobs > 1 and args.cluster.kind == "local":
        print(f"harness fuzz: --jobs {args.jobs} needs a cluster (--cluster ray --jobs {args.jobs}): a local campaign "
              "runs one worker", file=sys.stderr)
        return USAGE_ERROR
    try:
        cluster.check(args.cluster)
        if args.malloc_check:
            heap_check.environment()  # here too for a cluster, whose shards would find out only on the nodes
    except (cluster.ClusterError, ValueError) as e:
        print(f"harness fuzz: {e}", file=sys.stderr)
        return USAGE_ERROR
    cfg = Config(seconds=args.seconds, cases=args.cases, out=out, case_timeout=args.case_timeout,
                 shrink_seconds=args.shrink_seconds, baseline=args.baseline, resume=args.resume is not None,
                 cluster=args.cluster.label, jobs=args.jobs, malloc_check=args.malloc_check, **chosen)
    print(f"harness fuzz: seed {cfg.seed}, {cfg.seconds:g} s" + (f", at most {cfg.cases} cases" if cfg.cases else "")
          + f", backend {cfg.backend}" + (f", plugin {cfg.plugin}" if cfg.plugin else "")
          + (" (resumed: the campaign's own seed, ops, backend and plugin)" if cfg.resume else "")
          + (f", {cfg.jobs} worker(s) on {cfg.cluster}" if args.cluster.kind != "local" else "")
          + (", glibc's checking allocator" if cfg.malloc_check else "") + f" -> {cfg.out}",
          flush=True)
    try:
        if args.cluster.kind == "local":
            s = Campaign(cfg).run()
        else:
            with signals_raise(), cluster.connect(args.cluster, args.jobs) as where:
                s = Campaign(cfg).run(where)
    except (ValueError, WorkerSetupError) as e:  # a bad --ops, --backend, --plugin, --baseline or cluster: no traceback
        print(f"harness fuzz: {e}", file=sys.stderr)
        return USAGE_ERROR
    except Interrupted as e:  # before the campaign started (joining the cluster)
        print(f"harness fuzz: interrupted by {e.name}", file=sys.stderr)
        return e.exit_code
    print(f"{s['cases_run']} cases in {s['fuzz_s']:.1f} s ({s['cases_per_second']:.1f}/s), {s['n_ops_covered']} ops, "
          f"outcomes {s['outcomes']}, {s['distinct_failures']} new distinct failures, {len(s['known'])} known "
          f"(listed in {cfg.baseline})")
    for sig, f in s["failures"].items():
        print(f"  NEW {sig}  x{f['count']}  repro: {f['repro'] or 'none, ' + f.get('confirm', 'not shrunk')}")
    for sig, f in s["flaky"].items():
        print(f"  (flaky, not reproduced in a fresh worker) {sig}  x{f['count']}")
    for sig, f in s["known"].items():
        print(f"  known, not a bug: {sig}  x{f['count']}: {textwrap.shorten(f['reason'], 110)}")
    for cell in s.get("lost", []):
        print(f"  LOST {cell['cell']} ({cell['what']}): {cell['status']} on node {cell['node'] or '?'}: "
              f"{textwrap.shorten(cell['reason'], 160)}", file=sys.stderr)
    print(f"results: {cfg.out / 'results.jsonl'}; summary: {cfg.out / 'summary.json'}")
    if s.get("lost"):
        print(f"{len(s['lost'])} cell(s) of the campaign ended without a result (exit 1): --resume {cfg.out} runs "
              "the cases they had", file=sys.stderr)
    if s.get("interrupted"):
        print(f"interrupted by {s['interrupted']}: the cases that finished are in the results and the summary "
              f"(--resume {cfg.out} runs the rest)", file=sys.stderr)
        return 128 + signal.Signals[s["interrupted"]].value
    if s["failures"]:
        print(f"new findings fail the run (exit 1): fix them, or, if one is not a bug, add its signature and the "
              f"reason to {cfg.baseline}", file=sys.stderr)
    return 1 if s["failures"] or s.get("lost") else 0
