"""One shard of a fuzz campaign on a cluster, run as a cell (``python -m harness.fuzz.shard SPEC RESULT``):
a worker (``harness.fuzz.worker``, as a local campaign has) runs the shard's case indices, or confirms
and shrinks one finding, and the outcome is written to ``RESULT`` as JSON for the campaign's driver
(``harness.fuzz.on_cluster``), which judges, counts and writes everything.

``SPEC`` (JSON) holds the campaign's identity (what decides case i), its timeouts and either
``indices`` (explicit, then ``range(start, stop, step)``; no ``stop``: until the time budget ends) or
``confirm`` (a case and its signature). The worker's output goes to the cell's log, which the driver
appends to ``<out>/worker.log``.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from harness.fuzz.campaign import Config, confirm, select_rows
from harness.fuzz.cases import Case
from harness.fuzz.mutate import generate
from harness.fuzz.worker import Worker, WorkerSetupError


def indices(spec: dict[str, Any]) -> Iterator[int]:
    """The shard's case indices, in the order it runs them."""
    tail = itertools.count(spec["start"], spec["step"]) if spec["stop"] is None else range(spec["start"], spec["stop"],
                                                                                           spec["step"])
    return itertools.chain(spec["indices"], tail)


def config(spec: dict[str, Any]) -> Config:
    ident = dict(spec["identity"])
    ident["registry"] = Path(ident["registry"]) if ident.get("registry") else None
    return Config(**ident, case_timeout=spec["case_timeout"], shrink_seconds=spec["shrink_seconds"],
                  seconds=spec["seconds"])


def run(spec: dict[str, Any], log: Path) -> dict[str, Any]:
    """The shard's outcome: ``{"cases": [[case, result], ...]}`` or ``{"confirm": ...}``, with the worker's
    starts; ``{"setup_error": message}`` when its worker cannot start (a bad backend or plugin)."""
    cfg = config(spec)
    worker = Worker(cfg.backend, cfg.plugin, log, cfg.case_timeout, base=spec["base"])
    try:
        worker.prepare()
        worker.start()
        if "confirm" in spec:
            case = Case.from_json(spec["confirm"]["case"])
            got = confirm(case, spec["confirm"]["signature"], worker, cfg.shrink_seconds)
            if "small" in got:
                got["small"] = got["small"].to_json()
            return {"confirm": got, "starts": worker.starts}
        rows = select_rows(cfg)
        deadline = time.monotonic() + cfg.seconds
        ran = []
        for i in indices(spec["indices"]):
            if time.monotonic() >= deadline:
                break
            case = generate(rows, cfg.seed, i, cfg.max_numel)
            ran.append([case.to_json(), worker.run(case.to_json())])
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
