"""A fuzz campaign whose workers run on a cluster (``harness fuzz --cluster ray --jobs N``).

The campaign runs in rounds of ``ROUND_CASES`` cases per shard: a round's cases (the next ones) are
dealt round-robin to N shards (shard k runs the k-th, (k+N)-th, ... of them); each shard is a cell
(``harness.fuzz.shard`` in its own OS process with a timeout, on the cluster: ``max_retries=0``,
outcomes in completion order by ``ray.wait``, the resources of a cell on the campaign's backend) whose
worker runs its cases as a local campaign's does, confirming and shrinking the
first case of each new signature it sees. The driver here judges every case as a local campaign does
and writes the same ``results.jsonl`` lines (a shard's lines as it ends); each signature's finding is
the one of its lowest index, whichever shard ran it, so ``findings/`` and ``summary.json`` are a local
campaign's too (a round's cases all come before the next round's, whose shards are told the signatures
already found). Case i depends only on the campaign's identity, never on the shard that runs it, so a
case budget gives the same cases and findings as a local campaign.

A shard that does not end with a result (a lost worker or node, its timeout) is listed in the
summary's ``lost`` with its node and cases (never given again: ``--resume`` runs them; a round none
of whose shards ended stops the campaign); SIGINT or SIGTERM cancels what still runs and writes what
ended (``interrupted``).
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import expected
from harness.cells import CellRunner, Job, Outcome
from harness.fuzz.campaign import Campaign, select_rows
from harness.fuzz.cases import Case
from harness.fuzz.findings import Findings
from harness.fuzz.shard import indices
from harness.fuzz.worker import MAX_EXTENSION, READY_TIMEOUT_S, WorkerSetupError
from harness.interrupt import Interrupted

if TYPE_CHECKING:
    from harness.cluster import Cluster

SHARD = "harness.fuzz.shard"
ROUND_CASES = 200  # cases per shard and round: a progress line per shard and round, and what Ctrl-C can lose


def plan_shards(done: set[int], cases: int, workers: int) -> list[dict[str, Any]]:
    """The index specs of at most ``workers`` shards (``harness.fuzz.shard.indices``): the campaign's next
    ``cases`` cases, the indices missing below its last one first (an earlier session's lost or
    interrupted shard), dealt round-robin."""
    nxt = max(done) + 1 if done else 0
    gaps = [i for i in range(nxt) if i not in done][:cases]
    stop = nxt + max(0, cases - len(gaps))
    specs = []
    for k in range(workers):
        start = nxt + (k - len(gaps)) % workers
        spec = {"indices": gaps[k::workers], "start": start, "step": workers, "stop": stop}
        if spec["indices"] or start < stop:
            specs.append(spec)
    return specs


def run_on(c: Campaign, where: Cluster) -> dict:
    """Run campaign ``c`` as ``c.cfg.jobs`` shards at once on ``where``; returns (and writes) its summary."""
    cfg, t_start, workers = c.cfg, time.monotonic(), c.cfg.jobs
    known = expected.load()
    rows = select_rows(cfg)  # a bad --ops stops here, before any cell starts
    c.out.mkdir(parents=True, exist_ok=True)
    done = c.earlier_cases() if cfg.resume else set()
    (c.out / "campaign.json").write_text(json.dumps(cfg.identity(), indent=1) + "\n")
    common = {"identity": cfg.identity(), "case_timeout": cfg.case_timeout, "shrink_seconds": cfg.shrink_seconds,
              "baseline": str(cfg.baseline), "base": os.getcwd(), "malloc_check": cfg.malloc_check}
    failing: dict[str, list[tuple[Case, dict, dict | None]]] = {}  # new signatures: the cases that showed them
    lost: list[dict[str, Any]] = []
    tally = {"cases": 0, "starts": 0}
    nodes: set[str] = set()  # where the cells ran ('': here)
    stopped: Interrupted | None = None
    startup_s = time.monotonic() - t_start
    with tempfile.TemporaryDirectory(prefix="mncore-fuzz-") as tmp, \
            (c.out / "results.jsonl").open("a") as results, (c.out / "worker.log").open("ab") as worker_log:

        def shard_done(o: Outcome) -> str:
            """Record a shard's cases (its log appended to worker.log), or list it as lost."""
            worker_log.write(o.job.log.read_bytes() if o.job.log.exists() else b"")
            worker_log.flush()
            nodes.add(o.node)
            if o.kind != "result":
                spec = json.loads(o.job.args[0])["indices"]
                lost.append({"cell": o.job.label, "status": o.kind, "node": o.node, "what": f"cases {_describe(spec)}",
                             "reason": o.reason[-400:]})
                return f"{o.kind}: {o.reason[:200]}"
            got = json.loads(o.job.result.read_text())
            if "setup_error" in got:
                raise WorkerSetupError(got["setup_error"])
            tally["starts"] += got["starts"]
            tally["cases"] += len(got["cases"])
            for line in got["cases"]:
                case, res = Case.from_json(line["case"]), line["result"]
                sig = c.record(results, case, res, known)
                if sig and res["status"] != "known":
                    failing.setdefault(sig, []).append((case, res, line.get("confirm")))
                c.stats.shrink_s += line.get("confirm_s", 0.0)
            failed = sum(1 for line in got["cases"] if line["result"].get("status") == "fail")
            return f"{len(got['cases'])} cases, {failed} failing"

        t_fuzz = time.monotonic()
        deadline = t_fuzz + cfg.seconds
        planned = set(done)  # the indices run or given to a shard (a lost shard's are not given again)
        try:
            for r in itertools.count(1):
                size = ROUND_CASES * workers
                if cfg.cases is not None:
                    size = min(size, cfg.cases - (len(planned) - len(done)))
                seconds = deadline - time.monotonic()
                if seconds <= 0 or size <= 0:
                    break
                specs = plan_shards(planned, size, workers)
                spec_of = {**common, "seconds": seconds, "seen": sorted({*c.stats.failures, *c.stats.flaky, *failing})}
                paths = [Path(tmp, f"{r}-{k}.json") for k in range(len(specs))]
                jobs = [Job(f"round {r} shard {k}", SHARD, (json.dumps({**spec_of, "indices": spec}), str(path)), path,
                            device=cfg.backend) for k, (spec, path) in enumerate(zip(specs, paths))]
                planned.update(i for spec in specs for i in indices(spec))
                # Past its seconds a shard ends its last case and may confirm and shrink a finding (3 runs, 3 starts).
                timeout = seconds + cfg.shrink_seconds + 4 * ((1 + MAX_EXTENSION) * cfg.case_timeout + READY_TIMEOUT_S)
                lost_before = len(lost)
                with CellRunner(len(jobs), f"fuzz round {r}", timeout=timeout, cluster=where) as runner:
                    runner.run(jobs, shard_done, status=lambda v: v)
                if len(lost) - lost_before == len(jobs):  # no shard of the round ended: the cluster is not usable
                    break
        except Interrupted as e:  # the cells are cancelled (CellRunner.run); what ended is written
            stopped = e
        _book(c, failing, Findings(c.out))
    summary = c.summary(len(done) + tally["cases"], tally["cases"], time.monotonic() - t_start,
                        time.monotonic() - t_fuzz, startup_s, rows, tally["starts"], lost, stopped and stopped.name)
    summary["nodes"] = sorted(nodes - {""})
    (c.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _book(c: Campaign, failing: dict[str, list[tuple[Case, dict, dict | None]]], findings: Findings) -> None:
    """Each new signature as a local campaign enters it: its first case (the lowest index, which the
    shard that ran it confirmed and shrank), the number of cases that showed it; in order of first case."""
    for sig, seen in sorted(failing.items(), key=lambda kv: min(case.index for case, _, _ in kv[1])):
        earlier = c.stats.failures.get(sig) or c.stats.flaky.get(sig)  # entered by an earlier session
        if earlier is not None:
            earlier["count"] += len(seen)
            continue
        case, res, outcome = min(seen, key=lambda seen_case: seen_case[0].index)
        if outcome is None:  # its shard judged it otherwise (another --baseline file on its node)
            c.stats.failures[sig] = {"count": len(seen), "first_case": case.index, "kind": res.get("kind"),
                                     "oracle": res.get("oracle"), "message": str(res.get("message", ""))[:1000],
                                     "repro": None, "confirm": "not confirmed by its shard"}
            continue
        if "small" in outcome:
            outcome = {**outcome, "small": Case.from_json(outcome["small"])}
        c.book(sig, case, res, outcome, findings, len(seen))


def _describe(spec: dict[str, Any]) -> str:
    head = f"{spec['indices']} then " if spec["indices"] else ""
    return f"{head}{spec['start']}..{spec['stop'] - 1} step {spec['step']}"
