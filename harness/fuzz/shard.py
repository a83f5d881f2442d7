"""One shard of a fuzz campaign on a cluster, run as a cell (``python -m harness.fuzz.shard SPEC RESULT``):
a worker (``harness.fuzz.worker``, as a local campaign has) runs the shard's case indices and, as a local
campaign does, confirms and shrinks the first case of each new signature in a fresh worker; the outcome
goes to ``RESULT`` as JSON for the campaign's driver (``harness.fuzz.on_cluster``), which counts and
writes everything.

``SPEC`` (JSON) holds the campaign's identity (what decides case i), its timeouts and budgets, the
signatures it has already confirmed (``seen``) and the indices: explicit ones, then ``range(start, stop,
step)``; it stops early when its ``seconds`` are up. The worker's output goes to the cell's log, which the
driver appends to ``<out>/worker.log``.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from harness import expected
from harness.fuzz.baseline import load as load_baseline
from harness.fuzz.campaign import Config, confirm, judge, select_rows
from harness.fuzz.mutate import generate
from harness.fuzz.worker import Worker, WorkerSetupError


def indices(spec: dict[str, Any]) -> Iterator[int]:
    """The shard's case indices, in the order it runs them."""
    return itertools.chain(spec["indices"], range(spec["start"], spec["stop"], spec["step"]))


def config(spec: dict[str, Any]) -> Config:
    ident = dict(spec["identity"])
    ident["registry"] = Path(ident["registry"]) if ident.get("registry") else None
    return Config(**ident, case_timeout=spec["case_timeout"], shrink_seconds=spec["shrink_seconds"],
                  seconds=spec["seconds"], baseline=Path(spec["baseline"]), malloc_check=spec["malloc_check"])


def run(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    """``{"cases": [{"case", "result"[, "confirm", "confirm_s"]}, ...], "starts"}``: each case's result (as the
    worker gave it: the driver judges it), with what confirming a new signature found;
    ``{"setup_error": message}`` when the worker cannot start (a bad backend or plugin)."""
    cfg = config(spec)
    worker = Worker(cfg.backend, cfg.plugin, log, cfg.case_timeout, base=spec["base"], malloc_check=cfg.malloc_check)
    try:
        worker.prepare()
        rows, known, baseline = select_rows(cfg), expected.load(), load_baseline(cfg.baseline)
        worker.start()
        seen = set(spec["seen"])
        deadline = time.monotonic() + cfg.seconds
        ran = []
        for i in indices(spec["indices"]):
            if time.monotonic() >= deadline:
                break
            case = generate(rows, cfg.seed, i, cfg.max_numel)
            res = worker.run(case.to_json())
            line: dict[str, Any] = {"case": case.to_json(), "result": res}
            judged = dict(res)
            sig = judge(case, judged, cfg.backend, known, baseline)
            if sig and judged["status"] != "known" and sig not in seen:
                seen.add(sig)
                t0 = time.monotonic()
                got = confirm(case, sig, worker, cfg.shrink_seconds)
                if "small" in got:
                    got["small"] = got["small"].to_json()
                line.update(confirm=got, confirm_s=time.monotonic() - t0)
            ran.append(line)
        return {"cases": ran, "starts": worker.starts}
    except WorkerSetupError as e:
        return {"setup_error": str(e)}
    finally:
        worker.close()


def main(spec_text: str, result: Path) -> None:
    log = result.with_suffix(".log")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # appended to, like the worker's own writes
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    outcome = run(json.loads(spec_text), log)
    part = result.with_suffix(".part")
    part.write_text(json.dumps(outcome, default=str))
    part.replace(result)  # whole or absent: a shard killed mid-write has no result


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
