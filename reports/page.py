"""Report pages: each report's ``report.md`` + PNGs, and ``index.md``/``index.html`` over all of them.

Everything here reads results files (``results.jsonl``, ``meta.json``, timeline files) only.
"""
from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from reports import plots, reference, tables
from reports.results import REPORTS, load, read_rows, report_dir, split_peers

Block = tuple[str, Any]
TITLES = {"mlp-width": "MLP width sweep: lazy mode vs Context API",
          "async": "Execution modes: trace/device overlap (GPT-2 small training)",
          "models": "Models: ResNet-18 and GPT-2 small, lazy mode vs Context API"}
CAPTURED_COLUMN = (
    "captured ms/step, captured/Context: the lazy step wrapped in `mncore.capture` (traced until two recordings "
    "agree, then replayed without running Python), timed like lazy mode after the same warm-up, and its ratio to "
    "the Context API; a timed step it did not replay is listed under the table")
PEERS_COLUMN = (
    "peers (backend `torch:cpu`): the same step in eager PyTorch and with the model under `torch.compile` "
    "(inductor), both on this machine's CPU in the same run, measured wall time: what a user would otherwise "
    "run; torch.compile warm-up s is the wall time of the warm-up steps, where it compiles; "
    "<backend>: captured/eager is that backend's captured lazy step over the eager step")
COLUMNS = {
    "mlp-width": [
        "Context ms/step, lazy ms/step: training-step time (forward, backward, SGD) of the Context API "
        "(compiled once, called per step) and of lazy mode (traced every step, `mncore.sync()`): the median "
        "[min–max] of the intervals between consecutive steps' completions on the device (the steady-state "
        "period of the host-trace/device pipeline; N timed steps give N−1 intervals)",
        "lazy/Context: ratio of the two medians, measured in the same run (the seed's headline number)",
        CAPTURED_COLUMN,
        "trace ms/step: host time producing a lazy step's graph (timeline host `trace` spans between graph "
        "cuts: model code, autograd and mncore's dispatch)",
        "device ms/step: graph execution time of a lazy step on the device lane",
        "lazy step is: trace-bound when trace > device, else device-bound",
        "time: `measured wall time` (pfvm: real kernels) or `modelled device time, measured host time` "
        "(mncore2 performance mode: the worker holds each graph for its modelled time)",
        PEERS_COLUMN,
    ],
    "async": [
        "step ms: median [min–max] interval between consecutive steps' completions on the device",
        "trace ms/step: host `trace` spans of a step (host time producing its graph: model code, autograd, "
        "mncore's dispatch; between two graph cuts)",
        "device ms/step: the step's graph execution time (device lane)",
        "device idle ms/step: step interval minus device-busy time inside it; device util: busy / interval "
        "(medians over the intervals)",
        "step / max(trace, device): mean step interval over mean max(host trace, device) of the same steps; "
        "1.0 means the host trace and the device overlap perfectly (the `async` target: ≤ 1.05 when device > "
        "trace)",
        "seed (CUDA): the published GPT-2 small figures (CUDA backend) for reference",
    ],
    "models": [
        "lazy/Context: ratio of median step times in the same run; seed: ResNet-18 batch 32 = 1.05 (MN-Core)",
        CAPTURED_COLUMN,
        "breakdown: step, host trace (timeline), device (graph execution) and device idle are medians over the "
        "timed steps; in mncore dispatch (`trace_s`), graph cut (`sync_s`), compile (`compile_s`, 0 once warm) and "
        "host wait (`wait_s`: the host blocked on the worker) are the metrics counters over the window divided by "
        "the steps; warm-up compile: compile time during the warm-up steps",
        PEERS_COLUMN,
    ],
}


# -- blocks -> Markdown / HTML --------------------------------------------------------------------------
def markdown(blocks: list[Block], prefix: str = "") -> str:
    """The blocks as Markdown (``prefix``: prepended to image paths)."""
    out: list[str] = []
    for kind, val in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + val)
        elif kind == "p":
            out.append(val)
        elif kind == "ul":
            out.append("\n".join(f"- {x}" for x in val))
        elif kind == "table":
            out.append(tables.to_markdown(val))
        elif kind == "img":
            out.append(f"![{val[1]}]({prefix}{val[0]})")
        elif kind == "code":
            out.append("```\n" + val + "\n```")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    t = html.escape(text)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", t)


def html_page(blocks: list[Block], title: str, prefix: str = "") -> str:
    """The blocks as one HTML page; inline Markdown (code spans, bold) is rendered in tables too."""
    body: list[str] = []
    for kind, val in blocks:
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{_inline(val)}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_inline(val)}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in val) + "</ul>")
        elif kind == "table":
            cells = val.astype(object).map(lambda v: _inline(str(v)))
            cells.columns = [_inline(str(c)) for c in val.columns]
            body.append(cells.to_html(index=False, border=0, classes="t", escape=False))
        elif kind == "img":
            body.append(f'<p><img src="{html.escape(prefix + val[0])}" alt="{html.escape(val[1])}"></p>')
        elif kind == "code":
            body.append(f"<pre>{html.escape(val)}</pre>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table.t{border-collapse:collapse;font-size:13px;margin:1em 0}"
             "table.t td,table.t th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
             "img{max-width:100%}code{background:#f4f4f4}")
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# -- provenance -------------------------------------------------------------------------------------------
def provenance(meta: dict, df: pd.DataFrame) -> pd.DataFrame:
    kinds = sorted(set(df["time_kind"].dropna())) if "time_kind" in df else []
    states = []
    for b in meta.get("backends", []):
        states.append(f"{b['label']}: {b.get('state', 'ok')}")
    if not states and "backend" in df:
        states = [f"{b}: {', '.join(sorted(set(g['status'])))}" for b, g in df.groupby("backend")]
    load_s, load_e = meta.get("loadavg_start"), meta.get("loadavg_end")
    items = [
        ("git commit", meta.get("commit", "unknown")), ("torch", meta.get("torch", "?")),
        ("python", meta.get("python", "?")), ("machine", f"{meta.get('platform', '?')}; {meta.get('machine', '?')}"),
        ("GPU", meta.get("gpu", "?")), ("started", meta.get("when", "?")),
        ("load average (1/5/15 min) start → end",
         f"{' / '.join(f'{x:.2f}' for x in load_s)} → {' / '.join(f'{x:.2f}' for x in load_e)}"
         if load_s and load_e else "?"),
        ("backends", "; ".join(states) or "?"), ("times", "; ".join(kinds) or "?"),
        ("timed steps (after warm-up steps)", f"{meta.get('steps', '?')} (after {meta.get('warmup', '?')})"),
        *([("rounds", f"{meta['rounds']}: each API timed in that many child processes, interleaved with the "
                      "other APIs'; its median round makes the row")] if (meta.get("rounds") or 1) > 1 else []),
        ("execution mode", meta.get("execution", "per row")), ("config", meta.get("config", "?")),
        ("command", f"`{meta.get('command', '?')}`"), ("wall time", f"{meta.get('wall_s', '?')} s"),
    ]
    return pd.DataFrame(items, columns=["provenance", "value"])


# -- one report -------------------------------------------------------------------------------------------
def workloads(df: pd.DataFrame) -> str:
    """What was trained, from the rows (``workload``, written by the measurement; for results without it:
    model, config and batch), one per model."""
    seen: dict[str, str] = {}
    for _, r in df.iterrows() if len(df) else []:
        text = r.get("workload")
        if not isinstance(text, str):
            batch = r.get("batch")
            text = f"`{r['model']}` (config `{r.get('config', '?')}`" + (
                f", batch {int(batch)})" if batch is not None and not pd.isna(batch) else ")")
        seen.setdefault(str(r["model"]), text)
    return "; ".join(seen.values()) or "–"


def _article(meta: dict, what: str) -> Block:
    """Why the article's figures are not shown: the run measured another configuration."""
    return ("p", f"{reference.SOURCE[0].upper() + reference.SOURCE[1:]} gives {what} for the default configurations; "
                 f"this run used config `{meta.get('config')}`, so they are not compared here.")


def report_blocks(name: str, d: Path, heading: str = "h2", shared: frozenset[str] = frozenset()) -> list[Block]:
    """The report's tables and plots (images written into ``d``); paths relative to ``d``. ``shared``:
    provenance items the page states once for every report (left out here)."""
    meta, every = load(d)
    df, peers = split_peers(every)
    article = reference.comparable(meta.get("config"))
    good = df[df["status"] == "ok"] if len(df) else df
    blocks: list[Block] = [(heading, TITLES[name])]
    sub = "h3" if heading == "h2" else "h2"
    if name == "mlp-width":
        blocks.append(("p", f"Training step of an MLP (4 × [Linear(w, w) + ReLU] + classifier, SGD; {workloads(good[:1])}"
                            ", the other widths alike) in lazy mode (also captured: `mncore.capture`) and with the "
                            "Context API on each backend, same execution mode "
                            f"(`{meta.get('execution', 'async')}`)."))
        blocks.append(("p", f"For the same MLP on MN-Core, {reference.SOURCE} says: {reference.MLP_QUOTE}.") if article
                      else _article(meta, "the MLP's lazy/Context ratios"))
        blocks.append(("table", tables.mlp_table(df)))
        img = plots.mlp_ratio(df, d / "mlp_width_ratio.png", article)
        blocks.append(("img", (img.name, "lazy/Context ratio vs width")))
    elif name == "async":
        blocks.append(("p", f"Lazy-mode training of {workloads(good)} in the three execution modes of "
                            "`mncore.init(execution=...)`: `sync` (host waits for each graph), `async_naive` (worker "
                            "prepares and runs while the host traces on; both contend for the GIL), `async` (host "
                            "waits for the worker's preparation, then traces on). Where the worker buys nothing, "
                            "`sync` and `async` run each graph on the calling thread: `mncore2` in performance mode "
                            "(the job is only scheduled) and `pfvm:cpu` for graphs whose memory plan peaks below 256 MiB "
                            "(the kernels run on the host's own cores; `MNCORE_CPU_THREAD`), so those rows differ "
                            "only by noise. All numbers come from the "
                            "runtime's timeline."))
        blocks.append(("table", tables.async_table(df, article)))
        if article:
            seed = pd.DataFrame([{"mode": reference.MODE_NAMES[m], "step ms": v["step_ms"], "GPU idle ms": v["idle_ms"],
                                  "GPU util": f"{v['util']:.0%}", "trace ms": reference.ASYNC_TRACE_MS.get(m, "–")}
                                 for m, v in reference.ASYNC.items()])
            blocks += [(sub, f"Reference: {reference.SOURCE}, GPT-2 small on the CUDA backend"), ("table", seed)]
        else:
            blocks.append(_article(meta, "GPT-2 small's step, GPU idle and utilisation figures (CUDA backend)"))
        for backend in sorted(set(good["backend"])) if len(good) else []:
            slug = re.sub(r"[^A-Za-z0-9]+", "_", backend).strip("_")
            png = d / f"timeline_{slug}.png"
            if plots.async_timelines(d, df, backend, png):
                blocks.append(("img", (png.name, f"timeline {backend}")))
            elif png.exists():  # rendered in place from a copy without its timeline files: the earlier plot
                blocks += [("img", (png.name, f"timeline {backend}")),
                           ("p", f"(`{png.name}`: drawn when these results were rendered with their timeline files, "
                                 "which this directory does not hold.)")]
        traces = sorted(str(t) for t in good.get("chrome_trace", pd.Series(dtype=object)).dropna()) if len(good) else []
        if traces:
            blocks.append(("p", "Chrome/Perfetto traces of the timed steps (open in https://ui.perfetto.dev or "
                                "chrome://tracing; in `reports/out/async/`, not copied to `reports/published/`):"))
            blocks.append(("ul", [f"`{t}`" for t in traces]))
    elif name == "models":
        blocks.append(("p", f"Training steps of {workloads(good)} in lazy mode (also captured: `mncore.capture`) and "
                            "with the Context API, and where the time goes."))
        if not article:
            blocks.append(_article(meta, "ResNet-18's lazy/Context ratio"))
        blocks.append(("table", tables.models_table(df, article)))
        blocks += [(sub, "Breakdown per step"), ("table", tables.breakdown_table(df))]
        img = plots.models_breakdown(df, d / "models_breakdown.png")
        if img:
            blocks.append(("img", (img.name, "breakdown per step")))
    if len(peers):
        blocks += [(sub, "Peers: eager PyTorch and torch.compile on the same machine (CPU, measured wall time)"),
                   ("table", tables.peers_table(peers, df))]
    captured = tables.capture_notes(df)
    if captured:
        blocks += [("p", "Captured lazy steps that did not replay every timed step:"), ("ul", captured)]
    notes = tables.unavailable(every)
    if notes:
        blocks += [("p", "Not run:"), ("ul", notes)]
    ts = tables.targets(name, every)
    if ts:
        blocks += [(sub, "Targets (ratios measured in this run)"), ("table", tables.targets_table(ts))]
    blocks += [(sub, "Columns"), ("ul", COLUMNS[name])]
    prov = provenance(meta, df)
    blocks += [(sub, "Provenance" + (" (what differs between the reports)" if shared else "")),
               ("table", prov[~prov["provenance"].isin(shared)])]
    if not shared:
        blocks.append(("p", LOAD_NOTE))
    return blocks


LOAD_NOTE = ("Results files: `results.jsonl` (every field, per-step lists), `results.csv` (scalars), `meta.json`. "
             "The machine may be shared with other work, so concurrent load can inflate any number; the load "
             "average says how busy it was.")


def render_report(d: Path, name: str | None = None) -> Path:
    """Write ``d/report.md`` (+ PNGs) from ``d/results.jsonl``; returns the Markdown path."""
    d = Path(d)
    name = name or load(d)[1]["report"].dropna().iloc[0]
    text = markdown(report_blocks(name, d, heading="h1"))
    (d / "report.md").write_text(text)
    return d / "report.md"


# -- the page over every report -----------------------------------------------------------------------------
def found_reports(root: Path) -> list[tuple[str, Path]]:
    out = []
    for name in REPORTS:
        d = root / name
        if (d / "results.jsonl").exists():
            out.append((name, d))
    return out


def render_index(root: Path) -> tuple[Path, Path]:
    """``root/index.md`` and ``root/index.html`` with every report's tables, plots and provenance."""
    root = Path(root)
    found = found_reports(root)
    all_targets: list[tables.Target] = []
    for name, d in found:
        all_targets += tables.targets(name, load(d)[1])
    head: list[Block] = [("h1", "mncore performance reports"),
                         ("p", "Made by `harness report all` from the results files below (re-render without "
                               "running anything: `harness report all --from DIR`). Every number says its backend "
                               "and whether its device time is measured wall time or modelled."),
                         ("h2", "Targets")]
    head.append(("table", tables.targets_table(all_targets)) if all_targets else ("p", "_(no reports)_"))
    shared: frozenset[str] = frozenset()
    if found:  # what every report's provenance says alike is said once, here
        provs = [provenance(*load(d)).set_index("provenance")["value"] for _, d in found]
        same = [k for k in provs[0].index if all(k in p.index and p[k] == provs[0][k] for p in provs)]
        shared = frozenset(same)
        head += [("h2", "Provenance (every report)"),
                 ("table", pd.DataFrame({"provenance": same, "value": [provs[0][k] for k in same]})),
                 ("p", LOAD_NOTE)]
    md_parts = [markdown(head)]
    html_blocks = list(head)
    for name, d in found:
        blocks = report_blocks(name, d, shared=shared)
        blocks.append(("p", f"Results: `{name}/results.jsonl`, `{name}/results.csv`, `{name}/meta.json`."))
        md_parts.append(markdown(blocks, prefix=f"{name}/"))
        html_blocks += [(k, (f"{name}/{v[0]}", v[1]) if k == "img" else v) for k, v in blocks]
    (root / "index.md").write_text("\n".join(md_parts))
    (root / "index.html").write_text(html_page(html_blocks, "mncore performance reports"))
    return root / "index.md", root / "index.html"


def adopt(src: Path, dest: Path) -> None:
    """Copy a report's results files (and timelines) from ``src`` to ``dest`` to re-render there, and its
    plots: those the results can redraw are redrawn; a timeline plot whose files ``src`` lacks (a published
    copy of an older run) stays as it came, and the page says so."""
    if src.resolve() == dest.resolve():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("results.jsonl", "results.csv", "meta.json", *(p.name for p in src.glob("*.png"))):
        if (src / f).exists():
            shutil.copy2(src / f, dest / f)
    for sub in ("timelines", "traces"):
        if (src / sub).is_dir():
            shutil.copytree(src / sub, dest / sub, dirs_exist_ok=True)


MANIFEST = "harness-manifest.json"  # in a publish directory: the files the last publish wrote there


class PublishError(ValueError):
    """A publish that would lose or replace what it does not own, or publish nothing; nothing was changed."""


def owned(dest: Path) -> set[str]:
    """The files (relative to ``dest``) an earlier publish wrote there, from its manifest; ``PublishError``
    for a non-empty directory without one (someone else's files) or a manifest that points outside."""
    dest = Path(dest)
    if not dest.exists():
        return set()
    if not dest.is_dir():
        raise PublishError(f"--publish {dest} is a file, not a directory")
    manifest = dest / MANIFEST
    if not manifest.exists():
        if any(dest.iterdir()):
            raise PublishError(f"--publish {dest} is not empty and has no {MANIFEST} (it was not written by "
                               "harness report): refusing to replace its files; publish to a new or empty directory")
        return set()
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise PublishError(f"{manifest} is not a publish manifest (a JSON object with 'files'); fix or remove it") \
            from None
    bad = [f for f in files if not isinstance(f, str) or Path(f).is_absolute() or ".." in Path(f).parts]
    if bad:
        raise PublishError(f"{manifest} lists {bad[0]!r}, outside the directory; fix or remove it")
    return set(files)


def _publishable(root: Path) -> dict[str, Path]:
    """What a publish of ``root`` copies, by name in the publish directory: index.md/html, each report's
    Markdown, PNGs and results files (``results.jsonl``, ``results.csv``, ``meta.json``) and the timeline
    files its plots are drawn from, so that ``--from`` on the copy renders the same page (no Chrome traces)."""
    found = [(name, d) for name, d in found_reports(root) if read_rows(d)]
    if not found:
        raise PublishError(f"nothing to publish: no report under {root} has results rows")
    files = {f: root / f for f in ("index.md", "index.html") if (root / f).exists()}
    for name, d in found:
        timelines = sorted({r.timeline_file for r in read_rows(d) if r.timeline_file})
        for f in sorted(d.glob("*.png")) + [d / "report.md", d / "results.jsonl", d / "results.csv", d / "meta.json"]:
            if f.exists():
                files[f"{name}/{f.name}"] = f
        for rel in timelines:
            if (d / rel).is_file() and ".." not in Path(rel).parts:
                files[f"{name}/{rel}"] = d / rel
    return files


def publish(root: Path, dest: Path) -> list[Path]:
    """The commit-ready copy of ``root`` in ``dest``. Only files listed in ``dest``'s manifest (the last
    publish's) are removed or replaced; a foreign directory, a clash with a file it does not own or an
    empty report is refused (``PublishError``) before anything changes. Writes the new manifest."""
    root, dest = Path(root), Path(dest)
    mine, files = owned(dest), _publishable(root)
    clash = sorted(rel for rel in files if rel not in mine and (dest / rel).exists()
                   and not (dest / rel).samefile(files[rel]))  # (republishing a copy in place: its own files)
    if clash:
        raise PublishError(f"--publish {dest}: {clash[0]} exists and was not written by harness report "
                           f"(not in {MANIFEST}); move it away first")
    for rel in sorted(mine - files.keys()):
        (dest / rel).unlink(missing_ok=True)
        parent = (dest / rel).parent
        if parent != dest and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
    written = []
    for rel, src in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        same = (dest / rel).exists() and (dest / rel).samefile(src)  # republishing the copy itself
        written.append(dest / rel if same else Path(shutil.copy2(src, dest / rel)))
    (dest / MANIFEST).write_text(json.dumps({"files": sorted(files)}, indent=1) + "\n")
    return written


def locate(path: Path, name: str) -> Path | None:
    return report_dir(Path(path), name)
