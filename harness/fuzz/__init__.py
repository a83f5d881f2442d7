"""Registry-driven fuzzing of the mncore backend (``harness fuzz``).

Seeds are shape-registry rows; ``mutate`` derives cases (``cases``), ``worker`` runs them in an
isolated process against the ``oracles`` (eager PyTorch is the reference), ``shrink`` minimises
failures, ``findings`` writes deduplicated repro scripts and ``campaign`` is the loop. This module
only declares the command line, so ``harness --help`` does not import torch.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from harness import cluster
from harness.argtypes import directory, non_negative_float, non_negative_int, positive_float, positive_int

DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "fuzz"  # each campaign: DEFAULT_ROOT/<timestamp>/
BASELINE = DEFAULT_ROOT.parent / "ci" / "fuzz_baseline.json"  # known findings (harness.fuzz.baseline)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``harness fuzz`` options."""
    p.add_argument("--seconds", type=non_negative_float, default=60.0, help="fuzzing time budget (default 60)")
    p.add_argument("--seed", type=int, default=0, help="campaign seed: the same seed and --cases give the same cases")
    p.add_argument("--cases", type=non_negative_int, default=None, help="case budget (stop after N cases even if time is left)")
    p.add_argument("--ops", default=None,
                   help="op names to fuzz: comma-separated globs (aten.add*) or regexes (^aten\\.(mul|add)\\.Tensor$)")
    p.add_argument("--backend", default="pfvm:cpu", help="mncore device string (default pfvm:cpu)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=directory, default=None,
                       help=f"output directory, new or empty (default: a fresh {DEFAULT_ROOT}/<timestamp>)")
    where.add_argument("--resume", type=directory, default=None, metavar="DIR",
                       help="continue the campaign in DIR (its seed, ops, backend and plugin; the next cases; "
                            "findings and results kept); --cases then counts the new cases")
    p.add_argument("--plugin", default=None,
                   help="Python module (or .py file) imported in the worker before any case, e.g. one that "
                        "registers a lowering with mncore.register_lowering; recorded in repros")
    p.add_argument("--case-timeout", type=positive_float, default=20.0,
                   help="seconds before a case counts as a hang (plus 20x its eager time)")
    p.add_argument("--malloc-check", action="store_true",
                   help="run the workers under glibc's checking allocator (MALLOC_CHECK_=3): a kernel that writes "
                        "past its buffer then crashes in its own case, reproducibly, instead of some later case; "
                        "slower (docs/fuzzing.md)")
    p.add_argument("--shrink-seconds", type=non_negative_float, default=20.0, help="shrinking budget per distinct finding")
    p.add_argument("--max-numel", type=positive_int, default=1 << 16,
                   help="prefer registry rows with at most this many input elements and keep mutations under it")
    p.add_argument("--registry", type=Path, default=None, help="shape registry file (default: the checked-in one)")
    cluster.add_argument(p)
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="with --cluster ray...: workers at once, each running every N-th case (a local campaign runs "
                        "one worker); the same seed and --cases give the same cases and findings (docs/fuzzing.md)")
    p.add_argument("--baseline", type=Path, default=BASELINE,
                   help="known findings judged not to be bugs, each with its reason: they are listed and do not "
                        "fail the run (exit 0); any other finding exits 1 (default: ci/fuzz_baseline.json)")
