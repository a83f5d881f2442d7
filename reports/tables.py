"""Tables (pandas) and target verdicts made from a report's results rows.

Cells with a spread read ``median [min–max]`` over the timed steps; all times are per training step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from reports import reference
from reports.results import ok, split_peers

MLP_W4096_TARGET = 1.05
MLP_W64_TARGET = 3.0
ASYNC_SLACK = 0.05
TARGET_BACKEND = "pfvm:cpu"
MNCORE2 = "mncore2:auto (performance)"
# lazy/Context of the MLP, retracing every step: (backend, width) -> limit
LAZY_TARGETS = {(TARGET_BACKEND, 4096): MLP_W4096_TARGET, (TARGET_BACKEND, 64): MLP_W64_TARGET,
                (MNCORE2, 4096): 1.05, (MNCORE2, 64): 4.0}
CAPTURE_BACKENDS = (TARGET_BACKEND, MNCORE2)
MLP_CAPTURE_TARGET = 1.10  # captured/Context at every width, on each of CAPTURE_BACKENDS
MODEL_CAPTURE_TARGETS = {"gpt2_small": 1.10, "resnet18": 1.05}  # captured/Context on MNCORE2
CAPTURED_HOST_MS = {"gpt2_small": 2.0}  # host time per captured step, on MNCORE2


# -- formatting -------------------------------------------------------------------------------------
def num(v: object, unit: str = "") -> str:
    """A number with 3 significant figures or so (blank for missing values)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    x = float(v)  # type: ignore[arg-type]
    a = abs(x)
    text = f"{x:.0f}" if a >= 100 else f"{x:.1f}" if a >= 10 else f"{x:.2f}" if a >= 0.01 or a == 0 else f"{x:.1e}"
    return text + unit


def with_spread(row: pd.Series, key: str) -> str:
    """``median [min–max]`` of ``key`` from its ``_min``/``_max`` columns."""
    med = row.get(key)
    lo, hi = row.get(f"{key}_min"), row.get(f"{key}_max")
    if med is None or (isinstance(med, float) and math.isnan(med)):
        return "–"
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return num(med)
    return f"{num(med)} [{num(lo)}–{num(hi)}]"


def pct(v: object) -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v) * 100:.0f} %"  # type: ignore[arg-type]


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    if df.empty:
        return "_(no rows)_"
    cols = [str(c) for c in df.columns]
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(esc(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(lines)


def unavailable(df: pd.DataFrame) -> list[str]:
    """One note per backend (or model) that did not run, with the reason."""
    if not len(df):
        return []
    notes: dict[str, str] = {}
    for _, r in df[df["status"] != "ok"].iterrows():
        what = r["backend"] if r["status"] == "unavailable" else f"{r.get('model')} on {r['backend']}"
        notes.setdefault(str(what), f"{r['status']}: {str(r.get('reason', ''))[:300]}".replace("unavailable: unavailable:",
                                                                                              "unavailable:"))
    return [f"{k}: {v}" for k, v in notes.items()]


# -- tables -------------------------------------------------------------------------------------------
CAPTURED = ["captured ms/step", "captured/Context"]


def _captured(r: pd.Series) -> dict[str, str]:
    """The captured-lazy columns of a compare row ('–' where it did not measure)."""
    return {"captured ms/step": with_spread(r, "lazy_captured_step_ms"),
            "captured/Context": num(r.get("captured_ratio"))}


def mlp_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per backend and width: Context, lazy and captured lazy step time, their ratios to Context, trace and
    device time, bound."""
    rows = []
    for _, r in ok(df).sort_values(["backend", "width"]).iterrows() if len(ok(df)) else []:
        rows.append({
            "backend": r["backend"], "width": int(r["width"]),
            "Context ms/step": with_spread(r, "context_step_ms"), "lazy ms/step": with_spread(r, "lazy_step_ms"),
            "lazy/Context": num(r.get("ratio")), **_captured(r), "trace ms/step": with_spread(r, "lazy_trace_ms"),
            "device ms/step": with_spread(r, "lazy_device_ms"), "lazy step is": r.get("bound", "–"),
            "time": r.get("time_kind", ""), "steps": int(r["steps"]),
        })
    return pd.DataFrame(rows, columns=["backend", "width", "Context ms/step", "lazy ms/step", "lazy/Context",
                                       *CAPTURED, "trace ms/step", "device ms/step", "lazy step is", "time", "steps"])


ASYNC_ARTICLE = "article (CUDA) step / idle / util"
MODELS_ARTICLE = "article lazy/Context"


def async_table(df: pd.DataFrame, article: bool = True) -> pd.DataFrame:
    """Per backend and execution mode: step, trace, device, device idle and utilisation (timeline);
    ``article``: with the article's CUDA figures of the same mode (GPT-2 small, default config only)."""
    order = {m: i for i, m in enumerate(reference.ASYNC)}
    good = ok(df)
    if len(good):
        good = good.assign(_o=good["execution"].map(order)).sort_values(["backend", "_o"])
    rows = []
    for _, r in good.iterrows() if len(good) else []:
        ref = reference.ASYNC.get(r["execution"], {})
        rows.append({
            "backend": r["backend"], "mode": reference.MODE_NAMES.get(r["execution"], r["execution"]),
            "step ms": with_spread(r, "step_ms"), "trace ms/step": with_spread(r, "trace_ms"),
            "device ms/step": with_spread(r, "device_ms"), "device idle ms/step": with_spread(r, "idle_ms"),
            "device util": pct(r.get("util")), "bound": r.get("bound", "–"),
            "step / max(trace, device)": num(_ratio(r)), "time": r.get("time_kind", ""),
            "steps": int(r["steps"]),
            ASYNC_ARTICLE: f"{ref['step_ms']} ms / {ref['idle_ms']} ms / {ref['util']:.0%}" if ref else "–",
        })
    return pd.DataFrame(rows, columns=["backend", "mode", "step ms", "trace ms/step", "device ms/step",
                                       "device idle ms/step", "device util", "bound", "step / max(trace, device)",
                                       "time", "steps"] + ([ASYNC_ARTICLE] if article else []))


def _ratio(r: pd.Series) -> float:
    trace, device, step = _pipeline(r)
    return step / max(trace, device) if max(trace, device) > 0 else float("nan")


def models_table(df: pd.DataFrame, article: bool = True) -> pd.DataFrame:
    """Per model and backend: Context, lazy and captured lazy step time and their ratios; ``article``: with the
    article's ratio (ResNet-18 batch 32: 1.05; default config only)."""
    seed = {"resnet18": num(reference.RESNET18_RATIO)}
    rows = []
    for _, r in ok(df).sort_values(["model", "backend"]).iterrows() if len(ok(df)) else []:
        rows.append({
            "model": r["model"], "batch": int(r["batch"]), "backend": r["backend"],
            "Context ms/step": with_spread(r, "context_step_ms"), "lazy ms/step": with_spread(r, "lazy_step_ms"),
            "lazy/Context": num(r.get("ratio")), **_captured(r), MODELS_ARTICLE: seed.get(r["model"], "–"),
            "lazy step is": r.get("bound", "–"), "time": r.get("time_kind", ""), "steps": int(r["steps"]),
        })
    return pd.DataFrame(rows, columns=["model", "batch", "backend", "Context ms/step", "lazy ms/step", "lazy/Context",
                                       *CAPTURED, *([MODELS_ARTICLE] if article else []), "lazy step is", "time",
                                       "steps"])


def peers_table(peers: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """Per model: eager PyTorch and torch.compile step time on the CPU, and each backend's captured lazy
    step over the eager one (the rows of ``df`` for the same model)."""
    good, theirs = ok(peers), ok(df)
    backends = sorted(set(theirs["backend"])) if len(theirs) else []
    rows = []
    for _, r in good.sort_values(["width", "model"] if "width" in good else ["model"]).iterrows() if len(good) else []:
        row = {"model": r["model"], "batch": int(r["batch"]), "eager ms/step": with_spread(r, "eager_step_ms"),
               "torch.compile ms/step": with_spread(r, "compile_step_ms"),
               "torch.compile warm-up s": num(r.get("compile_warmup_compile_s")),
               "steps": int(r["steps"])}
        for b in backends:
            mine = theirs[(theirs["backend"] == b) & (theirs["model"] == r["model"])]
            captured = mine["lazy_captured_step_ms"].iloc[0] if len(mine) and "lazy_captured_step_ms" in mine else None
            eager = r.get("eager_step_ms")
            row[f"{b}: captured/eager"] = num(captured / eager if captured is not None and eager else None)
        if isinstance(r.get("compile_error"), str):
            row["torch.compile ms/step"] = f"not measured: {r['compile_error'][:120]}"
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", "batch", "eager ms/step", "torch.compile ms/step",
                                       "torch.compile warm-up s", *[f"{b}: captured/eager" for b in backends],
                                       "steps"])


def capture_notes(df: pd.DataFrame) -> list[str]:
    """One note per compare row whose captured lazy step did not replay every timed step, or did not run:
    its figures are then (partly) traced steps."""
    notes = []
    for _, r in ok(df).iterrows() if len(ok(df)) else []:
        what = f"{r['model']} on {r['backend']}"
        if isinstance(r.get("captured_error"), str):
            notes.append(f"{what}: not measured: {r['captured_error'][:300]}")
            continue
        replays = r.get("lazy_captured_replays_per_step")
        if replays is None or pd.isna(replays) or float(replays) >= 1.0:
            continue
        why = r.get("lazy_captured_capture_warning")
        notes.append(f"{what}: replayed {float(replays):.0%} of the timed steps"
                     + (f" ({str(why)[:300]})" if isinstance(why, str) else " (recordings in the timed window: "
                        "use --warmup 3 or more)"))
    return notes


API_NAMES = {"lazy": "lazy", "lazy_captured": "captured lazy", "context": "Context"}
BREAKDOWN = [("step ms", "step_ms"), ("host trace ms", "trace_ms"), ("in mncore dispatch ms", "dispatch_ms"),
             ("graph cut ms", "sync_ms"), ("compile ms", "compile_ms"), ("device ms", "device_ms"),
             ("host wait ms", "wait_ms"), ("device idle ms", "idle_ms")]


def breakdown_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, backend and API: where a step's time goes (medians per step; compile: in the timed window)."""
    rows = []
    for _, r in ok(df).sort_values(["model", "backend"]).iterrows() if len(ok(df)) else []:
        for api, name in API_NAMES.items():
            if f"{api}_step_ms" not in r or pd.isna(r.get(f"{api}_step_ms")):
                continue
            row = {"model": r["model"], "backend": r["backend"], "API": name}
            for label, key in BREAKDOWN:
                row[label] = num(r.get(f"{api}_{key}"))
            row["warm-up compile s"] = num(r.get(f"{api}_warmup_compile_s"))
            rows.append(row)
    return pd.DataFrame(rows, columns=["model", "backend", "API"] + [b[0] for b in BREAKDOWN] + ["warm-up compile s"])


# -- targets --------------------------------------------------------------------------------------------
@dataclass
class Target:
    report: str
    backend: str
    what: str
    limit: str
    value: str
    met: bool | None  # None: not measured / does not apply
    note: str = ""

    @property
    def verdict(self) -> str:
        if self.met is None:
            return "n/a" if self.note else "not measured"
        return "met" if self.met else "NOT met"


def _pipeline(r: pd.Series) -> tuple[float, float, float]:
    """(trace, device, step) means over the same steps; medians for results without them."""
    if "pipeline_step_ms" in r and not pd.isna(r.get("pipeline_step_ms")):
        return float(r["pipeline_trace_ms"]), float(r["pipeline_device_ms"]), float(r["pipeline_step_ms"])
    return float(r["trace_ms"]), float(r["device_ms"]), float(r["step_ms"])


def round_ratios(r: pd.Series, api: str) -> list[float]:
    """``api``'s step over the Context step, round by round (rounds ran interleaved, so round i of each
    API ran close in time); empty for a row timed in one round."""
    mine, context = r.get(f"{api}_round_step_ms"), r.get("context_round_step_ms")
    if not isinstance(mine, list) or not isinstance(context, list) or len(mine) != len(context) or len(mine) < 2:
        return []
    return [a / b for a, b in zip(mine, context) if b]


def _straddles(ratios: list[float], limit: float) -> bool:
    return bool(ratios) and min(ratios) <= limit < max(ratios)


def _rounds_note(ratios: dict[str, list[float]], limit: float) -> str:
    """Said next to a verdict whose rounds (``ratios``: per row, by what names it) fall on both sides of its
    limit: one round alone could have given the other verdict, so it rests on the median, not a clear margin."""
    parts = [f"{where}{min(rs):.2f}–{max(rs):.2f}" for where, rs in ratios.items() if _straddles(rs, limit)]
    if not parts:
        return ""
    return f"rounds {', '.join(parts)} fall on both sides of the limit: the verdict is the median's, not a clear margin"


def _mlp_targets(good: pd.DataFrame, peers: pd.DataFrame) -> list[Target]:
    """Lazy/Context at the two stated widths and backends, captured/Context at its worst width, and the
    captured step at w=64 on pfvm:cpu against eager PyTorch's (the peers row of the same run)."""
    ran = set(good["backend"]) if len(good) else set()
    out: list[Target] = []
    for (b, width), limit in LAZY_TARGETS.items():
        hit = good[(good["backend"] == b) & (good["width"] == width)] if b in ran else good.iloc[:0]
        v = float(hit.iloc[0]["ratio"]) if len(hit) and not pd.isna(hit.iloc[0].get("ratio")) else None
        if v is not None or b == TARGET_BACKEND:
            out.append(Target("mlp-width", b, f"lazy/Context at w={width}", f"≤ {limit}",
                              num(v) if v is not None else "–", None if v is None else v <= limit,
                              _rounds_note({"": round_ratios(hit.iloc[0], "lazy")}, limit) if v is not None else ""))
    for b in CAPTURE_BACKENDS:
        sub = good[good["backend"] == b] if b in ran and "captured_ratio" in good else good.iloc[:0]
        sub = sub[sub["captured_ratio"].notna()] if len(sub) else sub
        if len(sub):
            worst = sub.loc[sub["captured_ratio"].idxmax()]
            v = float(worst["captured_ratio"])
            rounds = {f"at w={int(r['width'])} ": round_ratios(r, "lazy_captured") for _, r in sub.iterrows()}
            out.append(Target("mlp-width", b, "captured/Context at every width", f"≤ {MLP_CAPTURE_TARGET:.2f}",
                              f"{v:.3f} (worst: w={int(worst['width'])} of {len(sub)})", v <= MLP_CAPTURE_TARGET,
                              _rounds_note(rounds, MLP_CAPTURE_TARGET)))
    mine = good[(good["backend"] == TARGET_BACKEND) & (good["width"] == 64)] if len(good) else good
    eager = peers[peers["width"] == 64] if len(peers) and "eager_step_ms" in peers else peers.iloc[:0]
    if len(mine) and len(eager) and not pd.isna(mine.iloc[0].get("lazy_captured_step_ms")):
        cap, ref = float(mine.iloc[0]["lazy_captured_step_ms"]), float(eager.iloc[0]["eager_step_ms"])
        out.append(Target("mlp-width", TARGET_BACKEND, "captured step at w=64 / eager PyTorch's", "≤ 1.0",
                          f"{num(cap / ref)} ({num(cap)} ms vs {num(ref)} ms)", cap <= ref))
    return out


def _model_targets(good: pd.DataFrame) -> list[Target]:
    """Captured/Context and the captured step's host time of the headline models on mncore2."""
    out: list[Target] = []
    on = good[good["backend"] == MNCORE2].set_index("model") if len(good) else good
    for model, limit in MODEL_CAPTURE_TARGETS.items():
        if model in on.index and not pd.isna(on.loc[model].get("captured_ratio")):
            v = float(on.loc[model, "captured_ratio"])
            out.append(Target("models", MNCORE2, f"{model} captured/Context", f"≤ {limit:.2f}", f"{v:.3f}",
                              v <= limit))
    for model, limit in CAPTURED_HOST_MS.items():
        if model in on.index and not pd.isna(on.loc[model].get("lazy_captured_trace_ms")):
            v = float(on.loc[model, "lazy_captured_trace_ms"])
            out.append(Target("models", MNCORE2, f"{model} host time per captured step", f"≤ {limit} ms",
                              f"{num(v)} ms", v <= limit))
    return out


def targets(name: str, every: pd.DataFrame) -> list[Target]:
    """The stated targets, judged on ratios measured in the same run (``every``: the report's rows,
    peers included: eager PyTorch's step is one target's reference)."""
    rows, peers = split_peers(every)
    good = ok(rows)
    out: list[Target] = []
    if name == "mlp-width":
        out = _mlp_targets(good, ok(peers))
    elif name == "models":
        out = _model_targets(good)
    elif name == "async":
        for b in sorted(set(good["backend"])) if len(good) else []:
            hit = good[(good["backend"] == b) & (good["execution"] == "async")]
            if not len(hit):
                continue
            r = hit.iloc[0]
            trace, device, step = _pipeline(r)
            bound = max(trace, device)
            what = "async step / max(trace, device)"
            value = f"{num(step / bound)} ({num(step)} ms vs {num(bound)} ms, means over the same steps)"
            if device > trace:
                out.append(Target(name, b, what, f"≤ {1 + ASYNC_SLACK:.2f}", value, step <= (1 + ASYNC_SLACK) * bound))
            else:
                out.append(Target(name, b, what, f"≤ {1 + ASYNC_SLACK:.2f} when device > trace", value, None,
                                  f"does not apply: device {num(device)} ms ≤ trace {num(trace)} ms (trace-bound)"))
    return out


def targets_table(ts: list[Target]) -> pd.DataFrame:
    return pd.DataFrame([{"report": t.report, "backend": t.backend, "target": t.what, "limit": t.limit,
                          "measured": t.value, "verdict": t.verdict, "note": t.note} for t in ts],
                        columns=["report", "backend", "target", "limit", "measured", "verdict", "note"])
