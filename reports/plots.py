"""Plots (matplotlib, Agg) made from results files."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from reports import reference  # noqa: E402
from reports.results import ok, read_timeline  # noqa: E402
from reports.tables import MLP_W64_TARGET, MLP_W4096_TARGET, num  # noqa: E402

APIS = [("context", "#8172b3", "Context API"), ("lazy", "#4c72b0", "lazy"),
        ("lazy_captured", "#64b5cd", "captured lazy")]
LANES = [("host", "trace", "host: trace", "#4c72b0"), ("host", "sync", "host: graph cut / wait", "#dd8452"),
         ("worker", None, "worker: prepare", "#55a868"), ("device", None, "device: graph", "#c44e52")]


def mlp_ratio(df: pd.DataFrame, path: Path, article: bool = True) -> Path:
    """lazy/Context step-time ratio against width (log-scale x), one line per backend (dashed: captured
    lazy/Context); ``article``: with the article's two figures."""
    fig = mlp_figure(df, article)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def mlp_figure(df: pd.DataFrame, article: bool = True) -> plt.Figure:
    """The figure of ``mlp_ratio``. Each width's values are labelled in order from the top: the highest
    above its point, the others below theirs, each lower one further down, so labels never overlap."""
    fig, ax = plt.subplots(figsize=(8, 6))
    good = ok(df)
    labels: dict[int, list[float]] = {}
    for backend, sub in (good.groupby("backend") if len(good) else []):
        sub = sub.sort_values("width")
        kind = sub["time_kind"].iloc[0]
        (line,) = ax.plot(sub["width"], sub["ratio"], marker="o", label=f"{backend} ({kind})")
        for w, r in zip(sub["width"], sub["ratio"]):
            labels.setdefault(int(w), []).append(float(r))
        if "captured_ratio" in sub and sub["captured_ratio"].notna().any():
            ax.plot(sub["width"], sub["captured_ratio"], marker="s", ls="--", color=line.get_color(),
                    label=f"{backend}: captured lazy (mncore.capture) / Context")
    for w, values in labels.items():
        for rank, r in enumerate(sorted(values, reverse=True)):
            ax.annotate(f"{r:.2f}", (w, r), textcoords="offset points", xytext=(0, 7 if rank == 0 else -15 - 13 * (rank - 1)),
                        ha="center", fontsize=9, zorder=6,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
    if article:
        ax.scatter([4096], [reference.MLP_W4096_RATIO], marker="*", s=140, color="black", zorder=5,
                   label=f"{reference.SOURCE}: 1.10x at w=4096 (MN-Core)")
        ax.axhline(reference.MLP_SMALL_W_RATIO, xmin=0.0, xmax=0.3, color="black", ls="--", lw=1.2,
                   label=f"{reference.SOURCE}: about 5x at small w (width not stated)")
    ax.scatter([64, 4096], [MLP_W64_TARGET, MLP_W4096_TARGET], marker="_", s=400, color="tab:green", zorder=4,
               label="targets (pfvm:cpu): ≤ 3.0 at w=64, ≤ 1.05 at w=4096")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    widths = sorted(set(good["width"].astype(int))) if len(good) else [64, 4096]
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.tick_params(labelsize=10)
    batches = sorted(set(good["batch"].dropna().astype(int))) if len(good) and "batch" in good else []
    ax.set_xlabel("MLP width w (4 layers" + (f", batch {', '.join(map(str, batches))})" if batches else ")"), fontsize=11)
    ax.set_ylabel("lazy (or captured lazy) / Context API step time", fontsize=11)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.08)
    ax.set_title("Lazy mode vs Context API: MLP width sweep", fontsize=12)
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    ax.grid(alpha=0.3)  # no tight_layout: it would shrink the axes to the legend's width (savefig crops instead)
    return fig


def _lane(lane: str, name: str) -> int | None:
    for i, (ln, prefix, _, _) in enumerate(LANES):
        if ln == lane and (prefix is None or name.startswith(prefix)):
            return i
    return None


def async_timelines(d: Path, df: pd.DataFrame, backend: str, path: Path) -> Path | None:
    """Two consecutive steps per execution mode: host trace lane above the device lane."""
    good = ok(df)
    sub = good[(good["backend"] == backend)] if len(good) else good
    if not len(sub) or "timeline_file" not in sub:
        return None
    if not any(isinstance(f, str) and (d / f).exists() for f in sub["timeline_file"]):
        return None  # e.g. a published copy without its timeline files: nothing to draw from
    order = {m: i for i, m in enumerate(reference.ASYNC)}
    sub = sub.assign(_o=sub["execution"].map(order)).sort_values("_o")
    fig, axes = plt.subplots(len(sub), 1, figsize=(10, 1.9 * len(sub) + 0.6), squeeze=False)
    for ax, (_, r) in zip(axes[:, 0], sub.iterrows()):
        tl = read_timeline(d, r["timeline_file"]) if isinstance(r.get("timeline_file"), str) else None
        mode = reference.MODE_NAMES.get(r["execution"], r["execution"])
        if tl is None or len(tl["bounds_ms"]) < 2:
            ax.set_title(f"{mode}: no timeline file")
            continue
        b = tl["bounds_ms"]
        k = max(0, (len(b) - 1) // 2 - 1) if len(b) > 3 else 0
        lo, hi = b[k], b[min(k + 2, len(b) - 1)]
        graphs = sorted((s, e) for lane, _, s, e, _ in tl["events"] if lane == "device")
        if len(graphs) == len(b) - 1 and k + 1 < len(graphs):  # one graph per step: show both steps' graphs too
            lo, hi = min(lo, graphs[k][0]), max(hi, graphs[k + 1][1])
        for lane, name, s, e, _ in tl["events"]:
            i = _lane(lane, name)
            if i is None or e < lo or s > hi:
                continue
            ax.broken_barh([(s - lo, max(e - s, (hi - lo) * 0.002))], (len(LANES) - 1 - i - 0.4, 0.8),
                           color=LANES[i][3])
        for x in b[k:k + 3]:
            ax.axvline(x - lo, color="black", lw=0.7, ls="--")
        ax.margins(x=0)
        ax.set_yticks(range(len(LANES)), [lab for _, _, lab, _ in reversed(LANES)], fontsize=9)
        ax.set_xlim(0, hi - lo)
        ax.set_title(f"{mode}: step {r['step_ms']:.1f} ms, trace {r['trace_ms']:.1f} ms, device {r['device_ms']:.1f} ms,"
                     f" idle {r['idle_ms']:.1f} ms ({r['time_kind']})", fontsize=10)
        ax.tick_params(axis="x", labelsize=9)
    axes[-1, 0].set_xlabel("ms (dashed: the host's step ends; bars: two consecutive steps' host trace and device graphs)")
    fig.suptitle(f"{backend}: two consecutive steps of {sub.iloc[0]['model']} per execution mode", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def models_breakdown(df: pd.DataFrame, path: Path) -> Path | None:
    """Per model and backend: step, host trace, device, wait and compile time per step, lazy vs captured
    lazy vs Context."""
    fig = breakdown_figure(df)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def breakdown_figure(df: pd.DataFrame) -> plt.Figure | None:
    """The figure of ``models_breakdown``: two panels a row, so that a page of ~1200 px shows its text at
    10 px or more."""
    good = ok(df)
    if not len(good):
        return None
    keys = [("step", "step_ms"), ("host trace", "trace_ms"), ("device", "device_ms"), ("host wait", "wait_ms"),
            ("compile", "compile_ms")]
    groups = list(good.sort_values(["model", "backend"]).iterrows())
    cols = min(2, len(groups))
    rows = -(-len(groups) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, (_, r) in zip(axes.flat, groups):
        x = range(len(keys))
        for j, (api, color, name) in enumerate(APIS):
            vals = [float(r.get(f"{api}_{k}", 0) or 0) for _, k in keys]
            vals = [0.0 if v != v else v for v in vals]  # NaN: an API this row has not measured
            ax.bar([i + (j - 1) * 0.27 for i in x], vals, width=0.27, color=color, label=name)
        ax.set_xticks(list(x), [lab for lab, _ in keys], fontsize=10)
        ax.tick_params(axis="y", labelsize=10)
        ax.set_ylabel("ms per step", fontsize=10)
        ax.set_title(f"{r['model']} on {r['backend']}\nlazy/Context {num(r.get('ratio'))}, "
                     f"captured/Context {num(r.get('captured_ratio'))}", fontsize=11)
        ax.legend(fontsize=9)
    fig.tight_layout()
    return fig
