"""A fuzz campaign whose workers run on a cluster (``harness fuzz --cluster ray --jobs N``).

The campaign's next cases are dealt round-robin to N shards (shard k runs the k-th, (k+N)-th, ... of
them); each shard is a cell (``harness.fuzz.shard`` in its own OS process with a timeout, on the
cluster: ``max_retries=0``, outcomes in completion order by ``ray.wait``, the resources of a cell on the
campaign's backend). The driver here judges every case as a local campaign does and writes the same
``results.jsonl`` lines (a shard's lines as it ends), then confirms and shrinks each new signature's
first case (the lowest index, whichever shard found it) in a cell of its own, and writes the same
``findings/`` and ``summary.json``. Case i depends only on the campaign's identity, never on the shard
that runs it, so a case budget gives the same cases and findings as a local campaign.

A shard or confirmation that does not end with a result (a lost worker or node, its timeout) is
listed in the summary's ``lost`` with its node and cases (``--resume`` runs them); SIGINT or SIGTERM
cancels what still runs and writes the summary of what ended (``interrupted``).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from harness import expected
from harness.cells import CellRunner, Job, Outcome
from harness.fuzz.campaign import Campaign, select_rows
from harness.fuzz.cases import Case
from harness.fuzz.findings import Findings
from harness.fuzz.worker import MAX_EXTENSION, READY_TIMEOUT_S, WorkerSetupError
from harness.interrupt import Interrupted

if TYPE_CHECKING:
    from harness.cluster import Cluster

SHARD = "harness.fuzz.shard"


def plan_shards(done: set[int], cases: int | None, workers: int) -> list[dict[str, Any]]:
    """The index specs of at most ``workers`` shards (``harness.fuzz.shard.indices``): the campaign's next
    ``cases`` cases (no budget: every case until the time budget), the indices missing below its last
    one first (a lost or interrupted shard), dealt round-robin."""
    nxt = max(done) + 1 if done else 0
    gaps = [i for i in range(nxt) if i not in done]
    if cases is not None:
        gaps = gaps[:cases]
    stop = None if cases is None else nxt + max(0, cases - len(gaps))
    specs = []
    for k in range(workers):
        start = nxt + (k - len(gaps)) % workers
        spec = {"indices": gaps[k::workers], "start": start, "step": workers, "stop": stop}
        if spec["indices"] or stop is None or start < stop:
            specs.append(spec)
    return specs


def _case_time(c: Campaign) -> float:
    """The longest one case can take in a worker (its timeout, extended for slow cases)."""
    return (1 + MAX_EXTENSION) * c.cfg.case_timeout


def _unconfirmed(c: Campaign, sig: str, case: Case, res: dict, count: int, why: str) -> None:
    """A new signature whose confirmation did not run or did not end: a failure without a repro."""
    c.stats.failures[sig] = {"count": count, "first_case": case.index, "kind": res.get("kind"),
                             "oracle": res.get("oracle"), "message": str(res.get("message", ""))[:1000],
                             "repro": None, "confirm": why}


def run_on(c: Campaign, where: Cluster, workers: int) -> dict:
    """Run campaign ``c`` as ``workers`` shards on ``where``; returns (and writes) its summary."""
    cfg, t_start = c.cfg, time.monotonic()
    known = expected.load()
    rows = select_rows(cfg)  # a bad --ops stops here, before any cell starts
    c.out.mkdir(parents=True, exist_ok=True)
    done = c.earlier_cases() if cfg.resume else set()
    (c.out / "campaign.json").write_text(json.dumps(cfg.identity(), indent=1) + "\n")
    findings = Findings(c.out)
    common = {"identity": cfg.identity(), "case_timeout": cfg.case_timeout, "shrink_seconds": cfg.shrink_seconds,
              "seconds": cfg.seconds, "base": os.getcwd()}
    failing: dict[str, list[tuple[Case, dict]]] = {}  # new signatures: every case that showed them
    lost: list[dict[str, Any]] = []
    tally = {"cases": 0, "starts": 0}
    nodes: set[str] = set()  # where the cells ran ('' : here)
    stopped: Interrupted | None = None
    startup_s = time.monotonic() - t_start
    with tempfile.TemporaryDirectory(prefix="mncore-fuzz-") as tmp, \
            (c.out / "results.jsonl").open("a") as results, (c.out / "worker.log").open("ab") as worker_log:

        def cells(kind: str, specs: list[dict[str, Any]]) -> list[Job]:
            return [Job(f"{kind} {k}", SHARD, (json.dumps({**common, **spec}), str(Path(tmp, f"{kind}-{k}.json"))),
                        Path(tmp, f"{kind}-{k}.json"), device=cfg.backend) for k, spec in enumerate(specs)]

        def ended(o: Outcome, what: str) -> dict[str, Any] | None:
            """A cell's result (its log appended to worker.log), or None with the cell listed as lost."""
            worker_log.write(o.job.log.read_bytes() if o.job.log.exists() else b"")
            worker_log.flush()
            nodes.add(o.node)
            if o.kind != "result":
                lost.append({"cell": o.job.label, "status": o.kind, "node": o.node, "what": what,
                             "reason": o.reason[-400:]})
                return None
            got = json.loads(o.job.result.read_text())
            if "setup_error" in got:
                raise WorkerSetupError(got["setup_error"])
            tally["starts"] += got["starts"]
            return got

        def shard_done(o: Outcome) -> str:
            spec = json.loads(o.job.args[0])["indices"]
            got = ended(o, f"cases {_describe(spec)}")
            if got is None:
                return f"{o.kind}: {o.reason[:200]}"
            new = 0
            for case_json, res in got["cases"]:
                case = Case.from_json(case_json)
                sig = c.record(results, case, res, known)
                if sig and res["status"] != "known":
                    new += sig not in failing
                    failing.setdefault(sig, []).append((case, res))
            tally["cases"] += len(got["cases"])
            return f"{len(got['cases'])} cases, {new} new signatures"

        t_fuzz = time.monotonic()
        try:
            shards = cells("shard", [{"indices": spec} for spec in plan_shards(done, cfg.cases, workers)])
            timeout = cfg.seconds + _case_time(c) + 2 * READY_TIMEOUT_S
            _run(shards, "fuzz", timeout, where, shard_done)
            todo = []
            for sig, seen in sorted(failing.items(), key=lambda kv: min(case.index for case, _ in kv[1])):
                before = c.stats.failures.get(sig) or c.stats.flaky.get(sig)  # found by an earlier session
                if before is not None:
                    before["count"] += len(seen)
                else:
                    todo.append((sig, min(seen, key=lambda cr: cr[0].index), len(seen)))
            confirms = cells("confirm", [{"confirm": {"case": case.to_json(), "signature": sig}}
                                         for sig, (case, _), _ in todo])

            def confirm_done(o: Outcome) -> str:
                sig, (case, res), count = todo[confirms.index(o.job)]
                got = ended(o, f"confirming {sig}")
                if got is None:
                    _unconfirmed(c, sig, case, res, count, f"lost: {o.reason[:200]}")
                    return f"{sig}: {o.kind}"
                outcome = got["confirm"]
                if "small" in outcome:
                    outcome["small"] = Case.from_json(outcome["small"])
                c.book(sig, case, res, outcome, findings, count)
                c.stats.shrink_s += o.wall_s
                return f"{sig}: {'confirmed' if 'small' in outcome else 'flaky'}"

            timeout = cfg.shrink_seconds + 3 * (_case_time(c) + READY_TIMEOUT_S)
            _run(confirms, "fuzz confirm", timeout, where, confirm_done)
        except Interrupted as e:  # the cells are cancelled (CellRunner.run); what ended is written
            stopped = e
            for sig, seen in failing.items():
                if sig not in c.stats.failures and sig not in c.stats.flaky:
                    case, res = min(seen, key=lambda cr: cr[0].index)
                    _unconfirmed(c, sig, case, res, len(seen), f"not confirmed: interrupted by {e.name}")
    for name in ("failures", "flaky"):  # a local campaign's order: by first sighting
        setattr(c.stats, name, dict(sorted(getattr(c.stats, name).items(), key=lambda kv: kv[1]["first_case"])))
    summary = c.summary(len(done) + tally["cases"], tally["cases"], time.monotonic() - t_start,
                        time.monotonic() - t_fuzz, startup_s, rows, tally["starts"], lost, stopped and stopped.name)
    summary["nodes"] = sorted(nodes - {""})
    (c.out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def _describe(spec: dict[str, Any]) -> str:
    head = f"{spec['indices']} then " if spec["indices"] else ""
    end = "on" if spec["stop"] is None else spec["stop"] - 1
    return f"{head}{spec['start']}..{end} step {spec['step']}"


def _run(jobs: list[Job], desc: str, timeout: float, where: Cluster, finish: Callable[[Outcome], str]) -> None:
    if jobs:
        with CellRunner(len(jobs), desc, timeout=timeout, cluster=where) as runner:
            runner.run(jobs, finish, status=lambda v: v)

