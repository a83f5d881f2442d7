"""Performance measurements behind ``harness report``: timed training steps of zoo models.

Each measurement trains a zoo model on a backend in lazy mode (trace every step, ``mncore.sync()``),
in captured lazy mode (the same step wrapped in ``mncore.capture``: replayed once recorded) or with the
Context API (compile once, call), after ``warmup`` untimed steps, and reads the timed window back from
the runtime's timeline (host trace spans, device execution spans) and metrics.

A backend is a device string passed to ``mncore.init`` / ``MNDevice`` plus an optional ``sim_mode``
(``mncore2:auto`` defaults to the simulator's ``performance`` mode: modelled device time, measured
host time). pfvm devices run real kernels, so every pfvm time is measured wall time.

Per-step numbers (``analyse``), each a median with ``_min``/``_max``/``_mean`` over the timed steps:

- ``step_ms``     interval between consecutive steps' completions on the device (the steady-state
                  period of the host-trace/device pipeline; N timed steps give N-1 intervals);
- ``trace_ms``    host time spent producing the step's graph: the timeline's host ``trace`` spans
                  (everything the host does between two graph cuts: model code, autograd, mncore's
                  dispatch), clipped to the interval; 0 for the Context API (no tracing per call);
- ``device_ms``   execution time of the step's graph(s) on the device lane (on a performance-mode
                  simulator the modelled time; ``device_span_ms`` is how long the worker was held);
- ``idle_ms``     step interval minus device-busy time inside it; ``util`` = busy / interval;
- ``pipeline_ratio`` mean step interval / max(mean trace, mean device) over the same steps (the
                  overlap check: 1.0 is a perfect pipeline);
- ``dispatch_ms`` / ``sync_ms`` / ``wait_ms`` / ``compile_ms`` the metrics counters ``trace_s``
                  (time inside ``__torch_dispatch__``), ``sync_s`` (graph cuts), ``wait_s`` (host
                  waiting on the worker), ``compile_s`` in the window, divided by the steps.

Every cell (one model on one backend) runs in its own child process (``python -m harness.perf``),
so a crash, an OOM or a hang yields a row instead of a lost report.
"""
from __future__ import annotations

import bisect
import copy
import functools
import gc
import inspect
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cells import CellRunner, Job, Outcome
from reports.schema import Measurement, PerfRow

if TYPE_CHECKING:
    from harness.cluster import Cluster

EXECUTIONS = ("sync", "async_naive", "async")
MEASURED = "measured wall time"
MODELLED = "modelled device time, measured host time"
SIM_PREFIXES = ("mncore2", "emu2")


# -- backends --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backend:
    """A device string for ``mncore.init``/``MNDevice`` and the simulator mode (None for pfvm)."""

    device: str
    sim_mode: str | None = None

    @classmethod
    def parse(cls, text: str, sim_mode: str | None = None) -> Backend:
        """``pfvm:cpu``, ``pfvm:cuda``, ``mncore2:auto`` (performance mode), ``mncore2:auto@functional``."""
        device, _, mode = text.strip().partition("@")
        mode = mode or sim_mode
        if mode is None and device.startswith(SIM_PREFIXES):
            mode = "performance"
        return cls(device, mode or None)

    @property
    def label(self) -> str:
        return f"{self.device} ({self.sim_mode})" if self.sim_mode else self.device

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9]+", "_", self.label).strip("_")

    def to_json(self) -> dict:
        return {"device": self.device, "sim_mode": self.sim_mode}


def init_backend(backend: Backend, execution: str = "async") -> None:
    """``mncore.init`` on ``backend``; the simulator's mode is passed only when there is one."""
    import mncore

    kwargs: dict[str, Any] = {"implicit_sync": "silent", "execution": execution}
    if backend.sim_mode is not None:
        kwargs["sim_mode"] = backend.sim_mode
    mncore.init(backend.device, **kwargs)


def _mndevice(backend: Backend) -> Any:
    from mncore.context import MNDevice

    if backend.sim_mode is not None and "sim_mode" in inspect.signature(MNDevice).parameters:
        return MNDevice(backend.device, sim_mode=backend.sim_mode)
    return MNDevice(backend.device)


def probe(backend: Backend) -> str | None:
    """None if ``backend`` initialises; else ``'unavailable: <error>'`` (ValueError/TypeError from init)."""
    import mncore

    try:
        init_backend(backend)
    except (ValueError, TypeError) as e:
        return f"unavailable: {e}"
    finally:
        try:
            mncore.init("pfvm:cpu", implicit_sync="silent")
        except Exception:  # noqa: BLE001 - best effort
            pass
    return None


# -- timeline analysis -----------------------------------------------------------------------------
def _overlap(spans: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of ``spans`` (sorted and disjoint, as :func:`_union` returns them) inside ``[lo, hi]``;
    found by bisection, so analysing a long run is not quadratic in its steps."""
    i = max(bisect.bisect_right(spans, (lo, math.inf)) - 1, 0)
    total = 0.0
    while i < len(spans) and spans[i][0] < hi:
        s, e = spans[i]
        total += max(0.0, min(e, hi) - max(s, lo))
        i += 1
    return total


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def spread(values: list[float], name: str, scale: float = 1.0) -> dict[str, float]:
    """``name`` (median), ``name_min``, ``name_max`` and ``name_mean`` of ``values`` times ``scale``."""
    if not values:
        return {}
    v = [x * scale for x in values]
    return {name: statistics.median(v), f"{name}_min": min(v), f"{name}_max": max(v), f"{name}_mean": statistics.fmean(v)}


def analyse(events: list[tuple], bounds: list[float]) -> dict[str, Any]:
    """Per-step figures of a timed window from timeline events and the host's step ends (seconds).

    ``bounds[0]`` is the window start (device idle), ``bounds[i]`` the host's return from step i.
    Step time is the interval between consecutive steps' completions on the device (the steady-state
    period of the trace/device pipeline; the first step's ramp-up, with the device idle while the host
    traces, is left out), so ``idle = step - device`` per interval. Host trace (for a captured step, its
    replay) is taken per host step. Falls back to host step ends when the device events do not group
    evenly into steps.
    """
    n = len(bounds) - 1
    lo, hi = bounds[0], bounds[-1]
    # the host's own work per step: tracing, or replaying a captured step instead of tracing it
    host = [(s, e) for lane, name, s, e, _ in events if lane == "host" and name in ("trace", "replay")]
    trace = _union(host)
    device_ev = sorted((s, e, a) for lane, _, s, e, a in events if lane == "device" and e > lo)
    device = _union([(s, e) for s, e, _ in device_ev])
    traces = [_overlap(trace, bounds[i], bounds[i + 1]) for i in range(n)]
    spans = [e - s for s, e, _ in device_ev]
    # performance-mode simulators hold the worker for the modelled time (plus sleep overshoot): the
    # device time of a step is the modelled one; the spans still decide busy and idle
    modelled = [a.get("modelled_s") if isinstance(a, dict) else None for _, _, a in device_ev]
    durations = [float(m) for m in modelled] if device_ev and all(m is not None for m in modelled) else spans
    k = len(durations) // n if n and len(durations) % n == 0 else 0
    if k:
        per_step_device = [sum(durations[i * k:(i + 1) * k]) for i in range(n)]
        ends = [device_ev[(i + 1) * k - 1][1] for i in range(n)]
    else:
        per_step_device = [sum(durations) / n] * n if n else []
        ends = []
    if len(ends) >= 2:
        edges, basis = ends, "device completions"
    else:
        edges, basis = list(bounds), "host step ends"
    steps, busy, idle, util = [], [], [], []
    for a, b in zip(edges, edges[1:]):
        steps.append(b - a)
        busy.append(_overlap(device, a, b))
        idle.append(steps[-1] - busy[-1])
        util.append(busy[-1] / steps[-1] if steps[-1] > 0 else 0.0)
    kinds = {str(a.get("time")) for _, _, a in device_ev if isinstance(a, dict) and a.get("time")}
    if steps:  # the pipeline over the same steps: total step time vs the larger of total trace and device
        m = len(steps)
        tr, dv = sum(traces[n - m:]) / m, sum(per_step_device[n - m:]) / m
        pipeline = {"pipeline_step_ms": sum(steps) / m * 1e3, "pipeline_trace_ms": tr * 1e3,
                    "pipeline_device_ms": dv * 1e3, "pipeline_ratio": (sum(steps) / m) / max(tr, dv, 1e-12)}
    else:
        pipeline = {}
    out: dict[str, Any] = {"steps": n, "intervals": len(steps), "step_basis": basis, "window_s": hi - lo,
                           "device_busy_s": _overlap(device, lo, max(hi, ends[-1] if ends else hi)),
                           "graphs_in_window": len(device_ev), "device_time_kinds": sorted(kinds)}
    out.update(pipeline)
    out.update(spread(steps, "step_ms", 1e3))
    out.update(spread(traces, "trace_ms", 1e3))
    out.update(spread(per_step_device, "device_ms", 1e3))
    if k and durations is not spans:
        out.update(spread([sum(spans[i * k:(i + 1) * k]) for i in range(n)], "device_span_ms", 1e3))
    out.update(spread(idle, "idle_ms", 1e3))
    out.update(spread(util, "util"))
    out["per_step"] = {"step_ms": [x * 1e3 for x in steps], "trace_ms": [x * 1e3 for x in traces],
                       "device_ms": [x * 1e3 for x in per_step_device], "idle_ms": [x * 1e3 for x in idle]}
    return out


def time_kind(backend: Backend, kinds: list[str]) -> str:
    """What the device times are: the timeline's ``time`` argument if set, else by backend."""
    if "modelled" in kinds:
        return MODELLED
    if "measured" in kinds:
        return MEASURED
    return MODELLED if backend.device.startswith(SIM_PREFIXES) and backend.sim_mode == "performance" else MEASURED


def _timeline_dump(events: list[tuple], bounds: list[float]) -> dict:
    t0 = bounds[0]
    return {"t0": "window start (ms)", "bounds_ms": [(b - t0) * 1e3 for b in bounds],
            "events": [[lane, name, (s - t0) * 1e3, (e - t0) * 1e3,
                        {k: v for k, v in (a or {}).items() if isinstance(v, (int, float, str, bool))}]
                       for lane, name, s, e, a in events if e >= t0 - 1.0]}


# -- measurements ----------------------------------------------------------------------------------
def _counters_delta(c0: dict, c1: dict, n: int) -> dict[str, Any]:
    d = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1 if isinstance(c1.get(k), (int, float))}
    per = max(n, 1)
    out = {"dispatch_ms": d.get("trace_s", 0.0) / per * 1e3, "sync_ms": d.get("sync_s", 0.0) / per * 1e3,
           "wait_ms": d.get("wait_s", 0.0) / per * 1e3, "compile_ms": d.get("compile_s", 0.0) / per * 1e3,
           "execute_ms": d.get("execute_s", 0.0) / per * 1e3, "compiles": int(d.get("compiles", 0)),
           "graphs_per_step": d.get("graphs_executed", 0) / per, "traced_ops_per_step": d.get("traced_ops", 0) / per,
           "implicit_syncs_per_step": d.get("implicit_syncs", 0) / per, "cache_hits": int(d.get("cache_hits", 0)),
           "replays": int(d.get("replays", 0))}
    if "modelled_device_s" in c1:
        out["modelled_device_ms"] = d.get("modelled_device_s", 0.0) / per * 1e3
    return out


def _effective_sim_mode() -> str | None:
    """The simulator mode the runtime actually ran in (None on pfvm devices)."""
    import mncore

    settings = mncore.config.current()
    return settings.sim_mode if settings.simulated else None


def _value(read: Any) -> float | None:
    """The final loss as a float (None when the backend computes no values, e.g. performance mode)."""
    if _effective_sim_mode() == "performance":
        return None
    try:
        v = float(read())
    except Exception:  # noqa: BLE001
        return None
    return v


def _batches(spec: Any, config: str, count: int, seed: int) -> list[dict]:
    return [spec.make_batch(config, seed=seed + i) for i in range(max(1, min(count, 4)))]


def _fresh(template: Any, spec: Any, config: str, seed: int) -> Any:
    from harness.runner import disable_dropout

    if template is not None:
        try:
            return copy.deepcopy(template)
        except Exception:  # noqa: BLE001 - some modules refuse deepcopy; build again
            pass
    return disable_dropout(spec.build(config, seed=seed))


def _run_timed(step: Any, steps: int, warmup: int) -> tuple[dict, Any]:
    """``warmup`` untimed calls of ``step(i)``, then ``steps`` timed ones; returns the timeline analysis
    of the timed steps (with counters and warm-up figures) and the last step's result."""
    import mncore
    from mncore import profile

    mncore.wait_device_ops()  # counters are read only with no graph in flight (the worker counts them)
    w0 = mncore.metrics.counters()
    t = time.perf_counter()
    last = None
    for i in range(warmup):
        last = step(i)
    mncore.wait_device_ops()
    warm_s = time.perf_counter() - t
    w1 = mncore.metrics.counters()
    profile.clear()
    c0 = mncore.metrics.counters()
    bounds = [profile.now()]
    for i in range(steps):
        last = step(warmup + i)
        if i == steps - 1:
            mncore.wait_device_ops()
        bounds.append(profile.now())
    c1 = mncore.metrics.counters()
    events = profile.events()
    res = analyse(events, bounds)
    res.update(_counters_delta(c0, c1, steps))
    res.update(sim_mode_effective=_effective_sim_mode(), warmup=warmup, warmup_s=warm_s,
               warmup_compile_s=w1["compile_s"] - w0["compile_s"], timeline=_timeline_dump(events, bounds))
    return res, last


def measure_lazy(spec: Any, config: str, backend: Backend, *, execution: str = "async", steps: int = 5,
                 warmup: int = 2, seed: int = 0, template: Any = None, trace_path: Path | None = None,
                 capture: bool = False) -> dict:
    """Lazy mode: the runner's step (``model_zoo.train_step`` + ``mncore.sync()``), timed after warm-up;
    ``capture``: the step wrapped in ``mncore.capture`` (``replays_per_step`` says how many timed steps
    replayed: capture records ``CAPTURE_WARMUP`` calls first, so a shorter warm-up leaves recordings in)."""
    import mncore
    import model_zoo
    from harness.runner import capturable, capture_warnings

    init_backend(backend, execution)
    model = _fresh(template, spec, config, seed).to("mncore")
    opt = spec.optimizer(model.parameters())
    if capture:
        capturable(opt)
    batches = _batches(spec, config, steps + warmup, seed)
    train: Any = lambda batch: model_zoo.train_step(spec, model, opt, batch)  # noqa: E731
    captured = mncore.capture(train) if capture else train

    def step(i: int) -> Any:
        loss = captured(model_zoo.batch_to(batches[i % len(batches)], "mncore"))
        mncore.sync()
        return loss

    with capture_warnings() as refused:
        res, loss = _run_timed(step, steps, warmup)
    res.update(api="lazy_captured" if capture else "lazy", execution=execution,
               loss=_value(lambda: loss.detach().cpu()), time_kind=time_kind(backend, res["device_time_kinds"]))
    if capture:
        res.update(replays_per_step=res["replays"] / steps, capture_warning="; ".join(refused) or None)
    if trace_path is not None:
        mncore.profile.export_chrome_trace(trace_path)
    gc.collect()
    return res


def measure_context(spec: Any, config: str, backend: Backend, *, execution: str = "async", steps: int = 5,
                    warmup: int = 2, seed: int = 0, template: Any = None) -> dict:
    """Context API: the runner's compiled step (registered params/buffers/optimizer state), timed."""
    from harness.runner import context_step

    init_backend(backend, execution)
    model = _fresh(template, spec, config, seed)
    ctx, step_fn = context_step(spec, model, _mndevice(backend))

    batches = _batches(spec, config, steps + warmup, seed)
    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frozen-constant notices (e.g. HF position buffers)
        compiled = ctx.compile(step_fn, batches[0], Path(tmp) / "step")
    compile_s = time.perf_counter() - t
    res, out = _run_timed(lambda i: compiled(batches[i % len(batches)]), steps, warmup)
    res.update(api="context", execution=execution, context_compile_s=compile_s, loss=_value(lambda: out["loss"].item()),
               time_kind=time_kind(backend, res["device_time_kinds"]))
    try:  # write back and release this context's device values
        ctx.release()
    except Exception:  # noqa: BLE001 - e.g. a performance-mode simulator keeps no values to write back
        ctx.release(write_back=False)
    gc.collect()
    return res


def measure_peer(spec: Any, config: str, *, compiled: bool = False, steps: int = 5, warmup: int = 2, seed: int = 0,
                 template: Any = None) -> dict:
    """What a user would otherwise run, on the same machine in the same report: the step in eager PyTorch
    on the CPU, or with the model under ``torch.compile`` (inductor, CPU). These steps are synchronous (each
    returns when its work is done), so a step's time is the interval between two returns: measured wall
    time. ``warmup_compile_s`` is the warm-up's wall time, where torch.compile compiles."""
    import torch

    import model_zoo

    model = _fresh(template, spec, config, seed)
    opt = spec.optimizer(model.parameters())
    net = torch.compile(model) if compiled else model
    batches = _batches(spec, config, steps + warmup, seed)
    t = time.perf_counter()
    for i in range(warmup):
        model_zoo.train_step(spec, net, opt, batches[i % len(batches)])
    ends = [time.perf_counter()]
    loss = None
    for i in range(steps):
        loss = model_zoo.train_step(spec, net, opt, batches[(warmup + i) % len(batches)])
        ends.append(time.perf_counter())
    res = spread([b - a for a, b in zip(ends, ends[1:])], "step_ms", 1e3)
    res.update(api="compile" if compiled else "eager", intervals=steps, time_kind=MEASURED,
               loss=_value(lambda: loss.detach()), **({"warmup_compile_s": ends[0] - t} if compiled else {}))
    return res


# -- cells (one model on one backend, in a child process) -------------------------------------------
APIS = ("context", "lazy", "lazy_captured")
PEERS = ("eager", "compile")
# The parts of a cell that may fail without failing its row (the field that says why instead).
OPTIONAL = {"lazy_captured": "captured_error", "compile": "compile_error"}


def _measure(api: str) -> Any:
    """The measurement of ``api`` (looked up when called, so tests can replace the functions)."""
    if api == "context":
        return measure_context
    if api in PEERS:
        return lambda spec, config, backend, execution=None, **kw: measure_peer(spec, config, compiled=api == "compile",
                                                                                 **kw)
    return measure_lazy if api == "lazy" else functools.partial(measure_lazy, capture=True)


def _stub_row(cell: dict, backend: Backend, status: str, reason: str) -> PerfRow:
    """The row of a cell that measured nothing (backend unavailable, child crashed or timed out)."""
    return PerfRow(report=cell["report"], model=cell["model"], config=cell["config"], backend=backend.label,
                   device=backend.device, sim_mode=backend.sim_mode, steps=cell["steps"], warmup=cell["warmup"],
                   status=status, reason=reason, time_kind=time_kind(backend, []))


def _base_row(cell: dict, backend: Backend) -> PerfRow:
    import model_zoo

    spec = model_zoo.get(cell["model"])
    row = _stub_row(cell, backend, "ok", "")
    row.batch = spec.batch_sizes[cell["config"]]
    row.width = spec.config(cell["config"]).get("width")
    row.workload = workload(spec, cell["config"])
    return row


def workload(spec: Any, config: str) -> str:
    """What one training step of ``spec`` in ``config`` is (the report text says what was run, not what the
    default configuration would be): parameters, the batch's tensors and the optimizer."""
    model = spec.build(config)
    params = sum(p.numel() for p in model.parameters())
    shapes = ", ".join(f"{k} {'×'.join(map(str, v.shape))}" for k, v in spec.make_batch(config).items())
    size = f"{params / 1e6:.1f}M" if params >= 1e5 else f"{params:,}"
    return (f"`{spec.name}` config `{config}` ({size} parameters; batch {shapes}; "
            f"{type(spec.optimizer(model.parameters())).__name__})")


def _check_mode(row: PerfRow, backend: Backend, results: Any) -> None:
    """Say so in the row when the runtime did not run in the simulator mode that was asked for."""
    got = {r.get("sim_mode_effective") for r in results} - {backend.sim_mode}
    if backend.sim_mode is not None and got:
        row.warning = f"asked for sim_mode={backend.sim_mode}, the runtime ran in {sorted(map(str, got))}"


def _bound(trace_ms: float, device_ms: float) -> str:
    return "trace-bound" if trace_ms > device_ms else "device-bound"


def finish_compare(row: PerfRow, backend: Backend) -> PerfRow:
    """The lazy/Context and captured/Context ratios and the lazy step's bound, from the prefixed fields."""
    row.time_kind = row.lazy_time_kind or row.context_time_kind or row.lazy_captured_time_kind \
        or time_kind(backend, [])
    lazy, context = row.lazy, row.context
    if lazy.trace_ms is not None:
        row.window.trace_ms, row.window.device_ms = lazy.trace_ms, lazy.device_ms
        row.bound = _bound(lazy.trace_ms, lazy.device_ms)
    if (context.step_ms or 0) > 0:
        if lazy.step_ms is not None:
            row.ratio = lazy.step_ms / context.step_ms
        if row.lazy_captured.step_ms is not None:
            row.captured_ratio = row.lazy_captured.step_ms / context.step_ms
    return row


def _error(row: PerfRow, reason: str) -> None:
    row.status, row.reason, row.traceback = "error", reason, traceback.format_exc()[-2000:]


def _failed(row: PerfRow, api: str, reason: str) -> None:
    """A cell's API failed: lazy, Context or eager makes the row an error; captured lazy and torch.compile
    only say so in their ``OPTIONAL`` field (the row's other figures stay shown)."""
    if api not in OPTIONAL:
        _error(row, reason)
        return
    setattr(row, OPTIONAL[api], reason)
    row.traceback = row.traceback or traceback.format_exc()[-2000:]


def run_cell(cell: dict, artifacts: Path | None = None) -> list[PerfRow]:
    """Measure one cell in this process. ``cell``: report, model, config, backend, sim_mode, steps, warmup,
    and ``kind``: 'compare' (the ``apis`` asked for, default Context, lazy, captured lazy, in ``execution``:
    one row, with the ratios to Context of those that ran) or 'modes' (lazy in each of ``executions``, one
    row each, with timeline and Chrome trace files)."""
    import model_zoo

    backend = Backend(cell["backend"], cell.get("sim_mode"))
    spec = model_zoo.get(cell["model"])
    steps, warmup = int(cell["steps"]), int(cell["warmup"])
    if cell["kind"] == "peers":
        return [_measured_row(cell, backend, spec, cell.get("apis", PEERS), MEASURED)]
    try:
        init_backend(backend, "async")
    except (ValueError, TypeError) as e:
        row = _base_row(cell, backend)
        row.status, row.reason = "unavailable", f"unavailable: {e}"
        return [row]
    from harness.runner import disable_dropout

    template = disable_dropout(spec.build(cell["config"], seed=0))
    rows = []
    if cell["kind"] == "compare":
        rows.append(_measured_row(cell, backend, spec, cell.get("apis", APIS), None, template))
    else:
        for execution in cell.get("executions", EXECUTIONS):
            row = _base_row(cell, backend)
            row.api, row.execution = "lazy", execution
            name = f"{cell['model']}_{backend.slug}_{execution}"
            trace_path = artifacts / "traces" / f"{name}.trace.json" if artifacts else None
            try:
                res = measure_lazy(spec, cell["config"], backend, execution=execution, steps=steps, warmup=warmup,
                                   template=template, trace_path=trace_path)
            except Exception as e:  # noqa: BLE001 - the row records it
                _error(row, f"{type(e).__name__}: {str(e)[:400]}")
                rows.append(row)
                continue
            _check_mode(row, backend, [res])
            row.window, row.time_kind, row.per_step = Measurement.pick(res), res["time_kind"], res["per_step"]
            row.bound = _bound(res["trace_ms"], res["device_ms"])
            if artifacts:
                tl = artifacts / "timelines" / f"{name}.json"
                tl.parent.mkdir(parents=True, exist_ok=True)
                tl.write_text(json.dumps(res["timeline"]))
                row.timeline_file = str(tl.relative_to(artifacts))
                row.chrome_trace = str(trace_path.relative_to(artifacts))
            rows.append(row)
    return rows


def _measured_row(cell: dict, backend: Backend, spec: Any, apis: Any, kind: str | None,
                  template: Any = None) -> PerfRow:
    """One row with each of ``apis`` measured under its prefix (``kind``: the row's time kind when the
    APIs do not say it, as peers, which never run on the backend)."""
    from harness.runner import disable_dropout

    row = _base_row(cell, backend)
    row.execution = cell.get("execution", "async") if kind is None else None
    template = template if template is not None else disable_dropout(spec.build(cell["config"], seed=0))
    results = {}
    for api in apis:
        try:
            results[api] = _measure(api)(spec, cell["config"], backend, execution=row.execution,
                                         steps=int(cell["steps"]), warmup=int(cell["warmup"]), template=template)
        except Exception as e:  # noqa: BLE001 - the row records it
            _failed(row, api, f"{api}: {type(e).__name__}: {str(e)[:400]}")
            continue
        setattr(row, api, Measurement.pick(results[api]))
        if kind is None:
            setattr(row, f"{api}_time_kind", results[api]["time_kind"])
    if kind is not None:
        row.time_kind = kind
        return row
    _check_mode(row, backend, results.values())
    return finish_compare(row, backend)


def _optional_part(half: PerfRow, api: str) -> PerfRow:
    """An optional API's child row (``OPTIONAL``) with a failure of its own (a crash, a timeout) in its
    field, so that it never hides the other figures of the cell."""
    if api in OPTIONAL and half.status != "ok" and half.status != "unavailable":
        field = OPTIONAL[api]
        setattr(half, field, getattr(half, field) or f"{api}: {half.status}: {half.reason}")
        half.status, half.reason = "ok", ""
    return half


def _apis(cell: dict) -> tuple[str, ...]:
    return PEERS if cell["kind"] == "peers" else APIS


def _parts(cell: dict) -> list[tuple[str, int]]:
    """The (API, round) of each child of a compare or peers cell, in the order they run: ``rounds``
    rounds of one child per API, each round starting one API later than the one before, so that a slow
    stretch of the machine or a drift over the cell's minutes falls on every API alike."""
    apis = _apis(cell)
    return [(apis[(r + k) % len(apis)], r) for r in range(int(cell.get("rounds", 1))) for k in range(len(apis))]


def _median_round(api: str, rounds: list[PerfRow]) -> PerfRow:
    """The child row that stands for ``api`` in a cell timed in several rounds: a round that failed or
    measured nothing for it (the failure is what the row must say), else the round whose median step is
    the median of the rounds' (the lower middle for an even count), with every round's median step in
    ``round_step_ms``, in the order the rounds ran."""
    steps = [getattr(r, api).step_ms for r in rounds]
    for r, step in zip(rounds, steps):
        if r.status != "ok" or step is None:
            return r
    chosen = rounds[steps.index(statistics.median_low(steps))]
    if len(rounds) > 1:
        getattr(chosen, api).round_step_ms = steps
    return chosen


def _merge_compare(children: list[list[PerfRow]], backend: Backend, parts: list[tuple[str, int]]) -> PerfRow:
    """The children of a compare or peers cell (one per API and round, in ``parts`` order) as one row:
    each API's figures from its median round (``_median_round``); the first failure of an API that is
    not ``OPTIONAL`` decides the row's status."""
    apis = list(dict.fromkeys(api for api, _ in parts))
    by_api: dict[str, list[PerfRow]] = {api: [] for api in apis}
    for (api, _), (child,) in sorted(zip(parts, children), key=lambda pc: pc[0][1]):
        by_api[api].append(child)
    row: dict = {}
    for api in apis:
        record = _optional_part(_median_round(api, by_api[api]), api).to_json()
        bad = record["status"] != "ok"
        keep = {k: v for k, v in record.items() if k not in ("status", "reason") or bad}
        if bad and row.get("status") not in (None, "ok"):
            keep.pop("status", None)
            keep["reason"] = f"{row['reason']}; {record['reason']}"
        row.update(keep)
    row.setdefault("status", "ok")
    row.setdefault("reason", "")
    merged = PerfRow.from_json(row, where=f"{row['model']} on {backend.label}")
    return merged if tuple(apis) == PEERS else finish_compare(merged, backend)


def _jobs(i: int, cell: dict, backend: Backend, out: Path) -> list[Job]:
    """The child processes of a cell: for a compare or peers cell one per API and round (``_parts``; the
    first big measurement in a fresh process pays page faults a later one would not, which biased the
    ratio when the APIs shared one), else one."""
    stem = f"{cell['model']}_{backend.slug}"
    if cell["kind"] in ("compare", "peers"):
        rounds = int(cell.get("rounds", 1))
        children = [({**cell, "apis": [api]}, f"{i:02d}_{stem}_{api}" + (f"_r{r + 1}" if rounds > 1 else ""),
                     f" ({api}" + (f", round {r + 1} of {rounds})" if rounds > 1 else ")"))
                    for api, r in _parts(cell)]
    else:
        children = [(cell, f"{i:02d}_{stem}", "")]
    return [Job(f"{cell['model']} on {backend.label}{what}", "harness.perf",
                ("--cell", json.dumps(c), "--artifacts", str(out), "--out", str(out / "cells" / f"{name}.json")),
                out / "cells" / f"{name}.json", device=backend.device)
            for c, name, what in children]


def run_cells(cells: list[dict], out: Path, timeout: int = 1200, desc: str = "report",
              cluster: Cluster | None = None) -> list[PerfRow]:
    """Run each cell in child processes (``python -m harness.perf``, on ``cluster``: default here); every
    cell yields rows, even on a crash or a lost node. The first cell of each backend runs its first child
    alone: a backend that does not initialise then costs one child, not one per API and round."""
    planned = [(cell, Backend(cell["backend"], cell.get("sim_mode"))) for cell in cells]
    planned_jobs = [_jobs(i, cell, backend, out) for i, (cell, backend) in enumerate(planned)]
    rows: list[PerfRow] = []
    unavailable: dict[str, str] = {}
    tried: set[str] = set()

    def child_rows(o: Outcome, cell: dict, backend: Backend) -> list[PerfRow]:
        if o.kind == "result":
            return [PerfRow.from_json(r, where=str(o.job.result)) for r in json.loads(o.job.result.read_text())]
        return [_stub_row(cell, backend, "error" if o.kind == "crash" else o.kind, o.reason)]

    with CellRunner(sum(map(len, planned_jobs)), desc, timeout=timeout, cluster=cluster) as runner:
        for (cell, backend), jobs in zip(planned, planned_jobs):
            if backend.label in unavailable:  # init failed once: no child per model for the same answer
                rows.append(_stub_row(cell, backend, "unavailable", unavailable[backend.label]))
                for job in jobs:
                    runner.skip(f"{job.label}: unavailable")
                continue
            t0 = time.monotonic()
            run = functools.partial(runner.run, finish=lambda o: child_rows(o, cell, backend),
                                    status=lambda got: ", ".join(sorted({r.status for r in got})))
            halves = run(jobs[:1]) if backend.label not in tried and len(jobs) > 1 else []
            tried.add(backend.label)
            if halves and halves[0][0].status == "unavailable":  # the backend did not initialise
                got = halves[0]
                for job in jobs[1:]:
                    runner.skip(f"{job.label}: unavailable")
            else:
                halves += run(jobs[len(halves):])
                got = [_merge_compare(halves, backend, _parts(cell))] if cell["kind"] in ("compare", "peers") \
                    else halves[0]
            wall_s = round(time.monotonic() - t0, 1)
            for r in got:
                r.cell_wall_s = wall_s
                r.rounds = cell.get("rounds")  # set on compare and peers cells only
                if r.status == "unavailable":
                    unavailable[backend.label] = r.reason
            rows += got
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = argparse.ArgumentParser(description="measure one report cell (JSON rows)")
    ap.add_argument("--cell", required=True, help="JSON: report, kind, model, config, backend, sim_mode, steps, warmup")
    ap.add_argument("--artifacts", type=Path, help="directory for timelines and Chrome traces")
    ap.add_argument("--out", type=Path, help="write the rows here (JSON list) instead of stdout")
    a = ap.parse_args(argv)
    import mncore  # noqa: F401  (register the device before autograd's engine starts)

    rows = run_cell(json.loads(a.cell), a.artifacts)
    text = json.dumps([r.to_json() for r in rows])
    if a.out:
        a.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
