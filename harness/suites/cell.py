"""One shard of a suite (op_db, module_db or optim_db) in its own process: ``python -m harness.suites.cell
--suite opinfo --backend B --names a,b,... --cap K --out part.jsonl``.

Each op's result is appended to ``--out`` (one JSON object per line, flushed) as it finishes, so a crash
loses only the op that was running; the parent runs the ops after it in a new shard. An op running
longer than ``--op-timeout`` seconds is recorded as ``timeout`` and the process exits (its device state
is no longer trusted).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import warnings

from reports.schema import DATABASES

TIMED_OUT = 3  # exit status after an op timed out (the parent continues after it)
SUITES = tuple(DATABASES)  # opinfo, modules, optim: one per PyTorch test database


class _OpTimeout(BaseException):  # not caught by the per-sample handlers
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _OpTimeout()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.suites.cell")
    ap.add_argument("--suite", choices=SUITES, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--names", required=True)
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--no-backward", action="store_true")
    ap.add_argument("--op-timeout", type=int, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    import mncore
    from harness.suites.run import runner

    mncore.init(args.backend, implicit_sync="silent")
    run = runner(args.suite)
    signal.signal(signal.SIGALRM, _alarm)
    with open(args.out, "a") as out:
        for name in args.names.split(","):
            signal.alarm(args.op_timeout)
            try:
                res = dataclasses.asdict(run(name, "mncore", cap=args.cap, backward=not args.no_backward))
                signal.alarm(0)
            except _OpTimeout:
                res = {"name": name, "status": "timeout", "message": f"no result after {args.op_timeout}s"}
            out.write(json.dumps(res) + "\n")
            out.flush()
            if res["status"] == "timeout":
                return TIMED_OUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
