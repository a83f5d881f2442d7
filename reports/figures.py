"""``docs/figures.md``: every performance and conformance figure the README and docs/ quote, rendered from
the committed results files, so a figure in the documentation is never older than its results.

``make figures`` (= ``python -m reports.figures``) rewrites the page; ``--check`` only says whether the
committed page still equals what the results files give (``tests/test_docs.py`` runs that check).
Sources: the published reports (``reports/published/<report>/results.jsonl`` or ``results.csv`` with
``meta.json``), the tiers' expectations (``ci/expected/models_*.csv``, ``full_*.csv``) and the conformance pass
rates (``docs/conformance-results/pass_rates.json``), the generated op tests' rate
(``docs/conformance-results/optest_rate.json``, written by ``benchmarks/optest_rate.py``) and Ray's overhead
(``docs/cluster-results/results.json``, written by ``benchmarks/cluster_overhead.py``).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from reports import full_tier, tables
from reports.results import load, read_meta, split_peers
from reports.schema import DATABASES

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "reports" / "published"
CONFORMANCE = ROOT / "docs" / "conformance-results" / "pass_rates.json"
EXPECTED = ROOT / "ci" / "expected"
CLUSTER = ROOT / "docs" / "cluster-results" / "results.json"
OPTESTS = ROOT / "docs" / "conformance-results" / "optest_rate.json"
OUT = ROOT / "docs" / "figures.md"

SECTIONS = {
    "mlp-width": ("MLP width sweep (lazy mode, captured lazy mode and the Context API)",
                  "The torch_mncore article's MLP training step (4 × [Linear(w, w) + ReLU] + classifier, batch 64, SGD) at each "
                  "width, on each backend; `lazy/Context` is lazy mode's median step over the Context API's."),
    "async": ("GPT-2 small in the three execution modes",
              "Lazy-mode training of GPT-2 small (sequence 128, batch 2, AdamW) with `init(execution=...)` "
              "`sync`, `async_naive` and `async`; idle is the device's idle time inside a step."),
    "models": ("ResNet-18 and GPT-2 small (lazy, captured, Context)",
               "Training steps of ResNet-18 (batch 32, 224², SGD momentum) and GPT-2 small (sequence 128, "
               "batch 2, AdamW)."),
}


def read_report(d: Path) -> tuple[dict, pd.DataFrame]:
    """(provenance, rows) of one published report: ``results.jsonl`` when it is there (checked against
    the schema), else ``results.csv``."""
    if (d / "results.jsonl").exists():
        return load(d)
    return read_meta(d), pd.read_csv(d / "results.csv")


def provenance_line(meta: dict) -> str:
    """Date, commit, machine and command of one results file, in one line."""
    return (f"Measured {meta.get('when', '?')} at commit `{meta.get('commit', '?')}` on "
            f"{meta.get('machine', '?')} (GPU: {meta.get('gpu', '?')}), torch {meta.get('torch', '?')}, "
            f"{meta.get('steps', '?')} timed steps after {meta.get('warmup', '?')} warm-up; "
            f"command `{meta.get('command', '?')}`.")


def report_section(name: str, d: Path) -> list[str]:
    meta, every = read_report(d)
    df, peers = split_peers(every)
    title, what = SECTIONS[name]
    table = {"mlp-width": tables.mlp_table, "async": tables.async_table, "models": tables.models_table}[name](df)
    out = [f"## {title}", "", what, "", provenance_line(meta), "", tables.to_markdown(table), ""]
    if len(peers):
        out += ["Peers: eager PyTorch and torch.compile on the same CPU (measured wall time):", "",
                tables.to_markdown(tables.peers_table(peers, df)), ""]
    notes = tables.unavailable(every)
    if notes:
        out += ["Not run:", "", *[f"- {n}" for n in notes], ""]
    ts = tables.targets(name, every)
    if ts:
        out += ["Targets, judged from the ratios of this run:", "", tables.to_markdown(tables.targets_table(ts)), ""]
    return out


def conformance_section(path: Path) -> list[str]:
    rates = json.loads(path.read_text())
    rows = [{"suite": DATABASES[r["suite"]], "backend": r["backend"],
             "checks": r["checks"].replace("+", " + "),
             "pass (ops or modules)": f"{r['ops_pass']} / {r['ops']} ({r['ops_pass_pct']:.2f} %)",
             "pass (samples)": f"{r['samples_pass']:,} / {r['samples']:,} ({r['samples_pass_pct']:.2f} %)",
             "samples per op": r["samples_cap"], "measured": r["when"], "commit": f"`{r['commit']}`"}
            for _, r in sorted(rates.items(), key=lambda kv: (kv[1]["suite"], kv[1]["backend"]))]
    return ["## Conformance: PyTorch's OpInfo, ModuleInfo and OptimizerInfo databases", "",
            "Forward outputs and gradients (optimizers: parameters, state and loss after three steps) against "
            "eager PyTorch on the CPU (what is checked: "
            "[conformance.md](conformance.md)). Source: `docs/conformance-results/pass_rates.json`.", "",
            tables.to_markdown(pd.DataFrame(rows)), ""]


def _measured(r: dict) -> str:
    """When, where and by which command a benchmark's results file (``harness.results.write_owned_json``)
    was measured, with the load at its start and end, as one sentence."""
    load = ", ".join(f"{x:.1f}" for x in r.get("loadavg_start", [])[:1] + r.get("loadavg_end", [])[:1])
    return (f"Measured {r['when']} at commit `{r['commit']}` on {r['machine']} (1-minute load average {load} at "
            f"the start and end); command `{r['command']}`.")


def cluster_section(path: Path) -> list[str]:
    """``--cluster ray`` against ``--cluster local`` on one machine, and the plan on more nodes from it."""
    r = json.loads(path.read_text())
    verdict = "met" if r["ratio"] <= r["target"] else "NOT met"
    runs = pd.DataFrame([{"cells": r["cells"], "`--cluster local`": f"{r['local_s']:.1f} s",
                          "`--cluster ray`": f"{r['ray_s']:.1f} s", "ray / local": f"{r['ratio']:.3f}",
                          "target": f"≤ {r['target']:.2f}", "verdict": verdict}])
    return ["## Ray cluster overhead (`harness run --tier models`, pfvm:cpu)", "",
            f"{r['models']}, `--steps {r['steps']} --jobs {r['jobs']}`, {r['threads']}; measured wall time of each "
            f"whole command, one after the other (the Ray run starts and stops its embedded cluster). "
            + _measured(r), "",
            tables.to_markdown(runs), "",
            f"The tier on more nodes, simulated from the Ray run's cells ({r['cell_wall_s']:.0f} s of cell wall time, "
            f"the longest {r['longest_cell_s']:.0f} s; {r['cpus_per_node']} cells at a time per node, "
            f"{r['overhead_s']:.2f} s added per cell; see [cluster.md](cluster.md)):", "",
            tables.to_markdown(pd.DataFrame(r["plan"])), ""]


def optest_section(path: Path) -> list[str]:
    """The generated op tests' rate under ``pytest -n auto`` (each layout measured in the same run), judged
    against the target; a sample's rate is labelled as such (the target is stated for the whole set)."""
    r = json.loads(path.read_text())
    whole = r["sample"] == 0
    runs = pd.DataFrame([{"layout": run["layout"], "rows": f"{r['rows']:,}", "wall": f"{run['wall_s']:.1f} s",
                          "rows/s": f"{run['rows_per_s']:.1f}", "target": f"≥ {r['target_rows_per_s']:.0f}",
                          "verdict": ("met" if run["rows_per_s"] >= r["target_rows_per_s"] else "NOT met")
                          + ("" if whole else " (on a sample)"), "pytest": run["pytest"]} for run in r["runs"]])
    which = ("Every row" if whole
             else f"The deterministic sample of {r['rows']:,} rows (`MNCORE_OPTEST_SAMPLE={r['sample']}`)")
    return ["## Generated op tests: rows per second (`tests/test_generated_ops.py`, pfvm:cpu)", "",
            f"{which} of the shape registry ({r['registry_rows']:,} rows over {r['registry_ops']} distinct ops), "
            f"`pytest -n {r['workers']}`, {r['time']}: the whole pytest command, collection and worker start "
            f"included (collection alone: {r['collection']['wall_s']:.1f} s). " + _measured(r), "",
            tables.to_markdown(runs), ""]


TIERS = {
    "models": "Models tier: status per model (`harness run --tier models`, as `make run` checks it)",
    "full": "Full tier: status of the catalog models measured so far (`harness run --tier full`)",
}


def _backend(expected_file: Path) -> str:
    """``full_pfvm_cpu.csv`` -> ``pfvm:cpu`` (the file name's backend, its first ``_`` a ``:``)."""
    return expected_file.stem.split("_", 1)[1].replace("_", ":", 1)


def tier_section(expected: Path, tier: str) -> list[str]:
    """A tier's status per model and backend, from the expectations ``harness run`` checks."""
    files = sorted(expected.glob(f"{tier}_*.csv"))
    if not files:
        return []
    out = [f"## {TIERS[tier]}", "",
           f"From `ci/expected/{tier}_<backend>.csv`, which `harness run` compares every run with (a difference "
           "fails the run). `status` is the row's (eager, lazy and Context); `captured` is lazy mode under "
           "`mncore.capture`; `graphs/step` and `compiles after warm-up` are lazy mode's.", ""]
    if tier == "full":
        rows = [dict(r, backend=_backend(f)) for f in files
                for r in pd.read_csv(f, dtype=str, keep_default_na=False).to_dict("records")]
        out += ["Pass rate per backend and mode, and each row's first failure grouped by cause "
                "(`reports/full_tier.py`; a mode after a failed one is `unjudged`):", "",
                full_tier.report(rows), ""]
    for f in files:
        df = pd.read_csv(f, dtype=str, keep_default_na=False)
        counts = ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().sort_index().items())
        table = pd.DataFrame({"model": df["model"] + ":" + df["config"], "status": df["status"],
                              "captured": df["lazy_captured_status"],
                              "captured replays/step": df["lazy_captured_replays_per_step"],
                              "graphs/step": df["graphs_per_step"],
                              "compiles after warm-up": df["compiles_after_warmup"],
                              "reason": df["reason"] if "reason" in df else ""})
        out += [f"### `{f.stem.removeprefix(tier + '_')}` ({len(df)} model configs: {counts})", "",
                tables.to_markdown(table), ""]
    return out


def render(published: Path = PUBLISHED, conformance: Path = CONFORMANCE, expected: Path = EXPECTED,
           cluster: Path = CLUSTER, optests: Path = OPTESTS) -> str:
    """The whole page, from the results files alone."""
    out = ["# Measured figures", "",
           "<!-- generated by `make figures` (python -m reports.figures) from the results files; do not edit -->", "",
           "Every figure the README and the other pages quote lives here, rendered from the committed results "
           "files with the date, commit and machine each was measured on. `pfvm:*` rows are measured wall "
           "time; `mncore2:auto (performance)` rows are modelled device time with measured host time (the "
           "`time` column says which). The machine is a shared 2-core CPU box, so the load at the time can "
           "inflate any number. Re-measure with `make report` (writes `reports/published/`), then "
           "`make figures`.", ""]
    for name in SECTIONS:
        d = published / name
        if (d / "results.jsonl").exists() or (d / "results.csv").exists():
            out += report_section(name, d)
    out += tier_section(expected, "models") + tier_section(expected, "full")
    if conformance.exists():
        out += conformance_section(conformance)
    if optests.exists():
        out += optest_section(optests)
    if cluster.exists():
        out += cluster_section(cluster)
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m reports.figures", description=__doc__.split("\n\n")[0],
                                 epilog="example: python -m reports.figures --check")
    ap.add_argument("--out", type=Path, default=OUT, help="the page to write (default: docs/figures.md)")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when the page differs from what the results files give")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run `make figures`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
