"""``harness run --tier unit --suite opinfo|modules|optim --backend B``: the database's ops in shards, each shard
an isolated cell (``harness.cells.CellRunner`` running ``harness.suites.cell``), one ``OpRow`` per op.

A shard whose child crashes, runs out of memory or times out costs the op that was running (its row says
so); the ops after it run in a new shard. Rows are judged against ``ci/expected_op_failures.json``
(``harness.expected``): an unexpected failure or a pass of an op with an entry fails the run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from harness import expected
from harness.cells import CellRunner, Job, Outcome
from harness.suites.cell import TIMED_OUT
from reports.schema import DATABASES, OpRow

SHARD = 20  # ops per child process


def _suite(suite: str) -> tuple[Any, Callable[..., Any]]:
    """The suite's module (its ``database()``) and its ``run(name, device, cap=, backward=) -> OpResult``."""
    from harness.suites import modules, opinfo, optim

    return {"opinfo": (opinfo, opinfo.run_op), "modules": (modules, modules.run_module),
            "optim": (optim, optim.run_optimizer)}[suite]


def names(suite: str) -> list[str]:
    return list(_suite(suite)[0].database())


def runner(suite: str) -> Callable[..., Any]:
    return _suite(suite)[1]


def repro(suite: str, name: str, backend: str, cap: int, backward: bool) -> str:
    return (f"harness run --tier unit --suite {suite} --ops {name} --backend {backend} --samples {cap}"
            + ("" if backward else " --no-backward"))


def row(suite: str, res: dict, backend: str, cap: int, backward: bool,
        entries: list[expected.ExpectedFailure]) -> OpRow:
    """The row of one op's result (``OpResult`` as a dict), its status judged against its entry."""
    status = res["status"]
    entry = expected.lookup(res["name"], backend, suite, entries)
    failed = status in ("fail", "error", "timeout", "crash", "oom")
    reason = res.get("message", "") if status in ("pass", "skipped", "timeout", "crash", "oom", "eager_fail") else \
        f"sample {res.get('failing_sample', '')} {res.get('stage', '')}: {res.get('message', '')}"
    if entry is not None and failed:
        status, reason = "xfail", f"[{entry.category}] {entry.reason} (got: {reason})"
    elif entry is not None and status == "pass":
        status, reason = "xpass", (f"passes, but ci/expected_op_failures.json lists it ([{entry.category}] "
                                   f"{entry.reason}): remove the entry")
    return OpRow(model=res["name"], config=DATABASES[suite], backend=backend,
                 steps=res.get("samples", 0), status=status, reason=reason, time_kind="measured wall time",
                 suite=suite, checks="forward+backward" if backward else "forward",
                 samples_pass=res.get("passed"), samples_noise=res.get("noise"), backward=res.get("backward"),
                 failing_sample=res.get("failing_sample") or None,
                 expected_category=entry.category if entry else None,
                 repro=repro(suite, res["name"], backend, cap, backward), wall_s=round(res.get("wall_s", 0.0), 2))


def run_suite(suite: str, todo: list[str], backend: str, out: Path, *, cap: int, backward: bool, jobs: int = 1,
              timeout: int = 3600, op_timeout: int = 300, on_row: Callable[[OpRow], None] | None = None) -> list[OpRow]:
    """Every op of ``todo`` checked on ``backend``; ``on_row`` sees each row as its shard finishes."""
    from harness.tiers import run_id

    entries = expected.load()
    rows_dir = out / "rows" / run_id()
    rows: dict[str, OpRow] = {}
    pending = list(todo)
    round_ = 0
    while pending:
        shards = [pending[i:i + SHARD] for i in range(0, len(pending), SHARD)]
        jobs_: dict[Job, list[str]] = {}
        for i, shard in enumerate(shards):
            part = rows_dir / f"{suite}-{round_}-{i}.jsonl"
            args = ("--suite", suite, "--backend", backend, "--names", ",".join(shard), "--cap", str(cap),
                    "--op-timeout", str(op_timeout), "--out", str(part)) + (() if backward else ("--no-backward",))
            jobs_[Job(f"{suite} {shard[0]}..{shard[-1]} on {backend}", "harness.suites.cell", args, part)] = shard
        again: list[str] = []

        def finish(o: Outcome) -> str:
            shard = jobs_[o.job]
            done = [json.loads(line) for line in o.job.result.read_text().splitlines()] if o.job.result.exists() else []
            for res in done:
                rows[res["name"]] = r = row(suite, res, backend, cap, backward, entries)
                if on_row is not None:
                    on_row(r)
            rest = shard[len(done):]
            if rest and not (o.kind == "result" and o.returncode == TIMED_OUT):
                # rest[0] was running when the child died (a partial result file reads as kind "result")
                res = {"name": rest[0], "status": "crash" if o.kind == "result" else o.kind,
                       "message": o.reason or f"child exited {o.returncode}"}
                rows[rest[0]] = r = row(suite, res, backend, cap, backward, entries)
                if on_row is not None:
                    on_row(r)
                rest = rest[1:]
            again.extend(rest)
            bad = sum(rows[n].status not in ("pass", "xfail", "skipped") for n in shard if n in rows)
            return f"{len(done)} ops, {bad} unexpected"

        with CellRunner(len(jobs_), f"{suite} round {round_}" if round_ else suite, jobs=jobs, timeout=timeout) as runner:
            runner.run(list(jobs_), finish, status=lambda s: s)
        pending, round_ = again, round_ + 1
    return [rows[n] for n in todo if n in rows]


def problems(rows: list[OpRow]) -> list[str]:
    """What fails the run: unexpected failures and passes of ops that have an entry."""
    return [f"{r.model} on {r.backend}: {r.status}: {r.reason}" for r in rows
            if r.status not in ("pass", "xfail", "skipped", "eager_fail")]


def pass_rates(rows: list[OpRow]) -> dict[str, float | int]:
    """Ops and samples passing (xfail counts as a failure), over ops with at least one sample."""
    counted = [r for r in rows if r.status not in ("skipped", "eager_fail")]
    ops_pass = sum(r.status == "pass" for r in counted)
    samples = sum(r.steps or 0 for r in counted)
    samples_pass = sum(r.samples_pass or 0 for r in counted)
    return {"ops": len(counted), "ops_pass": ops_pass, "ops_pass_pct": round(100 * ops_pass / max(1, len(counted)), 2),
            "samples": samples, "samples_pass": samples_pass,
            "samples_pass_pct": round(100 * samples_pass / max(1, samples), 2)}
