"""The rows of results files as typed records: one declaration of every field, for writer and reader.

Pure data (standard library only), so that ``reports`` can read what ``harness`` writes without
importing either ``harness`` or ``mncore``. A row is written flat (one JSON object per line):
fields without a default are always written, optional ones only when set (``None`` means "not
measured", and reads back as ``None``). A field whose metadata says ``csv=False`` stays out of
``results.csv`` (tracebacks, per-step lists); other list or dict values go there as JSON text.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Row")


class SchemaError(ValueError):
    """A results row that does not match its declared schema (unknown or missing fields)."""


def jsonl_only(default: Any = None) -> Any:
    """An optional field kept out of ``results.csv`` (long text or nested lists)."""
    return field(default=default, metadata={"csv": False})


@dataclass(kw_only=True)
class Measurement:
    """The figures of one timed window (``harness.perf.analyse`` plus the metrics counters).

    Times are per training step; a bare name is the median over the timed steps, ``_min``/``_max``
    (and ``_mean`` for the step) their spread.
    """

    intervals: int | None = None
    """Step intervals measured (N timed steps give N-1)."""
    step_ms: float | None = None
    """Interval between consecutive steps' completions on the device."""
    step_ms_min: float | None = None
    step_ms_max: float | None = None
    step_ms_mean: float | None = None
    trace_ms: float | None = None
    """Host time producing the step's graph (timeline ``trace`` spans)."""
    trace_ms_min: float | None = None
    trace_ms_max: float | None = None
    device_ms: float | None = None
    """Graph execution time on the device lane (modelled time on a performance-mode simulator)."""
    device_ms_min: float | None = None
    device_ms_max: float | None = None
    idle_ms: float | None = None
    """Step interval minus device-busy time inside it."""
    idle_ms_min: float | None = None
    idle_ms_max: float | None = None
    util: float | None = None
    """Device busy / step interval."""
    util_min: float | None = None
    util_max: float | None = None
    dispatch_ms: float | None = None
    """Metrics counter ``trace_s`` (inside ``__torch_dispatch__``) per step."""
    sync_ms: float | None = None
    """Metrics counter ``sync_s`` (graph cuts) per step."""
    wait_ms: float | None = None
    """Metrics counter ``wait_s`` (host waiting on the worker) per step."""
    compile_ms: float | None = None
    """Metrics counter ``compile_s`` in the timed window, per step."""
    execute_ms: float | None = None
    """Metrics counter ``execute_s`` per step."""
    modelled_device_ms: float | None = None
    """Metrics counter ``modelled_device_s`` per step (simulators only)."""
    device_span_ms: float | None = None
    """How long the worker was held per step, where that differs from the modelled device time."""
    pipeline_step_ms: float | None = None
    """Mean step interval over the steps the pipeline figures cover."""
    pipeline_trace_ms: float | None = None
    pipeline_device_ms: float | None = None
    pipeline_ratio: float | None = None
    """Mean step / max(mean trace, mean device): 1.0 is a perfect trace/device overlap."""
    compiles: int | None = None
    """Compiles in the timed window."""
    graphs_per_step: float | None = None
    traced_ops_per_step: float | None = None
    implicit_syncs_per_step: float | None = None
    warmup_compile_s: float | None = None
    """Compile time during the warm-up steps."""
    context_compile_s: float | None = None
    """``Context.compile`` wall time (Context API only)."""
    loss: float | None = None
    """Final loss (None where the backend computes no values, e.g. performance mode)."""
    sim_mode_effective: str | None = None
    """The simulator mode the runtime ran in (None on pfvm devices)."""
    replays_per_step: float | None = None
    """Captured lazy only: timed steps ``mncore.capture`` replayed / timed steps (below 1.0: recordings or
    retraces in the window; a warm-up under 3 steps leaves recordings in)."""
    capture_warning: str | None = None
    """Captured lazy only: the ``CaptureWarning`` of a step capture refused to replay (it kept tracing)."""
    round_step_ms: list[float] | None = None
    """Cells timed in several rounds (``harness report --rounds``): each round's median step, in the order
    the rounds ran; the other figures are those of the median round."""

    @classmethod
    def pick(cls, figures: dict[str, Any]) -> Measurement:
        """The declared figures out of a larger dict (an analysis with timelines and per-step lists)."""
        return cls(**{f.name: figures[f.name] for f in dataclasses.fields(cls) if f.name in figures})


@dataclass(kw_only=True)
class Row:
    """What every row kind shares: which cell it is, how it went, and flat JSON in and out (checked
    against the declared fields)."""

    STATUSES: ClassVar[tuple[str, ...]] = ()
    model: str
    """Zoo model name."""
    config: str
    """Zoo config (``tiny``, ``default``, ...)."""
    backend: str
    """The device string, or a report's backend label (``mncore2:auto (performance)``)."""
    steps: int
    """Training steps (a report's timed steps)."""
    status: str
    """One of the row kind's ``STATUSES``."""
    reason: str
    """Why the status is what it is ('' when all went well)."""
    time_kind: str
    """``measured wall time`` or ``modelled device time, measured host time``."""

    FLATTENED: ClassVar[dict[str, str]] = {}
    """Fields holding a group of figures (a dataclass) written flat, each under its name prefix."""

    @classmethod
    def _own(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in cls.FLATTENED]

    @classmethod
    def _groups(cls) -> dict[str, Any]:
        """Flattened field -> the dataclass of its group (the field's default factory)."""
        return {f.name: f.default_factory for f in dataclasses.fields(cls) if f.name in cls.FLATTENED}

    @classmethod
    def _names(cls) -> dict[str, tuple[str | None, str]]:
        """Every name a results file may hold -> (its group, or None for an own field; the field's name)."""
        names: dict[str, tuple[str | None, str]] = {f.name: (None, f.name) for f in cls._own()}
        for group, kind in cls._groups().items():
            for f in dataclasses.fields(kind):
                names.setdefault(cls.FLATTENED[group] + f.name, (group, f.name))
        return names

    @classmethod
    def field_names(cls) -> list[str]:
        """Every name a row of this kind may have in a results file."""
        return list(cls._names())

    @classmethod
    def required(cls) -> list[str]:
        """The fields every row of this kind has."""
        return [f.name for f in cls._own()
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    def to_json(self) -> dict[str, Any]:
        """The flat record: required fields always, optional ones when set."""
        required = set(self.required())
        out = {f.name: getattr(self, f.name) for f in self._own()
               if f.name in required or getattr(self, f.name) is not None}
        for group, prefix in self.FLATTENED.items():
            figures = getattr(self, group)
            out.update({prefix + f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)
                        if getattr(figures, f.name) is not None})
        return out

    def csv_record(self) -> dict[str, Any]:
        """The record for ``results.csv``: fields marked ``csv=False`` left out, lists and dicts as JSON."""
        skip = {f.name for f in self._own() if not f.metadata.get("csv", True)}
        return {k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in self.to_json().items()
                if k not in skip}

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any], where: str) -> R:
        """A row from its flat record; ``SchemaError`` naming ``where`` for unknown or missing fields."""
        names = cls._names()
        unknown = [k for k in data if k not in names]
        missing = [k for k in cls.required() if k not in data]
        if unknown or missing:
            parts = ([f"unknown field(s) {', '.join(map(repr, unknown))}"] if unknown else []) + \
                    ([f"missing field(s) {', '.join(map(repr, missing))}"] if missing else [])
            raise SchemaError(f"{where}: {'; '.join(parts)} for a {cls.__name__} row "
                              f"(the fields are declared in reports/schema.py)")
        own: dict[str, Any] = {}
        grouped: dict[str, dict[str, Any]] = {group: {} for group in cls.FLATTENED}
        for key, value in data.items():
            group, name = names[key]
            (own if group is None else grouped[group])[name] = value
        kinds = cls._groups()
        return cls(**own, **{group: kinds[group](**values) for group, values in grouped.items()})


@dataclass(kw_only=True)
class ModeResult:
    """What the tier runner keeps of one mode's training run (lazy, captured lazy or Context API)."""

    status: str | None = None
    """``pass``, or the mode's own non-pass status (``fail_accuracy``, ``fail_to_run``, ``oom``,
    ``not_compilable``), judged as the row's (None: not run, or a results file from before this field)."""
    reason: str | None = None
    """Why the status is what it is (captured lazy: or the ``CaptureWarning`` of a step capture refused to replay)."""
    losses: list[float] | None = None
    """Per-step losses."""
    step_ms: float | None = None
    """Median step time after the first step."""
    param_max_abs_err: float | None = None
    """Largest parameter difference from eager after the last step."""
    compile_s: float | None = None
    """Compile time (lazy: over all steps; Context API: ``Context.compile``)."""


@dataclass(kw_only=True)
class CapturedResult(ModeResult):
    """Lazy mode with the step wrapped in ``mncore.capture``: it runs ``warmup`` more steps than the
    others (the calls capture records before it replays), so it has that many more losses, and its step
    time and replays are over the steps after them (the measured steps)."""

    warmup: int | None = None
    """Steps run before the measured ones (capture's recordings)."""
    replays_per_step: float | None = None
    """Replayed calls / measured steps (1.0: every measured step replayed; 0.0: still traced)."""
    retraces: dict[str, int] | None = None
    """``mncore.metrics.capture_retraces()`` of the run: why calls were traced instead of replayed."""


@dataclass(kw_only=True)
class ModelRow(Row):
    """One zoo model trained N steps on one backend by ``harness run --tier ...``: eager (reference),
    lazy mode, lazy mode under ``mncore.capture`` and the Context API from the same seed and data,
    judged and timed (always measured wall time: pfvm devices execute real kernels)."""

    STATUSES: ClassVar[tuple[str, ...]] = ("pass", "fail_accuracy", "fail_to_run", "eager_fail", "timeout", "oom",
                                           "skipped", "not_compilable", "node_lost")
    """``not_compilable``: the Context API cannot compile the step into one static graph (an op whose
    output shape depends on values); the reason names the op and its source line; lazy mode ran it."""
    FLATTENED: ClassVar[dict[str, str]] = {"lazy": "lazy_", "context": "context_", "lazy_captured": "lazy_captured_"}

    repro: str
    """The command that runs this row alone."""
    family: str | None = None
    """Zoo family (``mlp``, ``resnet``, ``gpt2``, ...)."""
    params: int | None = None
    """Parameter and buffer elements of the model."""
    traceback: str | None = jsonl_only()
    """The failing mode's traceback (tail), for the non-pass statuses that come from an exception."""
    eager_losses: list[float] | None = None
    """Per-step losses of eager CPU training, the reference (``lazy_captured_warmup`` more than ``steps``)."""
    eager_step_ms: float | None = None
    """Median eager step time after the first step."""
    trace_ms: float | None = None
    """Lazy mode: median host trace + graph-cut time per step (after the first)."""
    graphs_per_step: int | None = None
    """Graphs the last lazy step executed."""
    compiles_after_warmup: int | None = None
    """Lazy compiles from the third step on (0 once the graph cache is warm)."""
    cache_hits: int | None = None
    """Lazy compile-cache hits over all steps."""
    implicit_syncs_per_step: int | None = None
    """Implicit syncs (host reads of device values) in the last lazy step."""
    fallback_ops_per_step: int | None = None
    """Ops the last lazy step ran outside mncore's lowerings."""
    peak_device_bytes: int | None = None
    """Most device memory held by live buffers after a lazy step."""
    lazy_context_ratio: float | None = None
    """lazy_step_ms / context_step_ms."""
    captured_context_ratio: float | None = None
    """lazy_captured_step_ms / context_step_ms."""
    wall_s: float | None = None
    """Wall time of the row's child process (set by the parent)."""
    node: str | None = None
    """The address of the Ray node the cell ran on (``--cluster ray``; None when it ran here)."""
    lazy: ModeResult = field(default_factory=ModeResult)
    """Written as ``lazy_*``: lazy mode (its trace, graph and sync figures are the unprefixed fields)."""
    context: ModeResult = field(default_factory=ModeResult)
    """Written as ``context_*``: the Context API."""
    lazy_captured: CapturedResult = field(default_factory=CapturedResult)
    """Written as ``lazy_captured_*``: lazy mode with the step wrapped in ``mncore.capture``."""


PEER_BACKEND = "torch:cpu"
"""The backend of peers rows: what a user would otherwise run (eager PyTorch, torch.compile), on the CPU."""


@dataclass(kw_only=True)
class PerfRow(Row):
    """One measured row of ``harness report``: a model on a backend, timed after warm-up steps.

    ``compare`` rows (mlp-width, models) hold each API's figures under ``context_``/``lazy_``/
    ``lazy_captured_`` and the lazy step's trace/device time unprefixed; ``modes`` rows (async) hold one
    lazy run unprefixed; peers rows (backend ``PEER_BACKEND``) hold ``eager_`` and ``compile_``.
    """

    STATUSES: ClassVar[tuple[str, ...]] = ("ok", "error", "unavailable", "timeout", "oom", "node_lost")
    FLATTENED: ClassVar[dict[str, str]] = {"window": "", "context": "context_", "lazy": "lazy_",
                                           "lazy_captured": "lazy_captured_", "eager": "eager_",
                                           "compile": "compile_"}

    report: str
    """``mlp-width``, ``async`` or ``models``."""
    device: str
    """The device string of the backend."""
    sim_mode: str | None
    """The simulator mode asked for (None on pfvm devices)."""
    warmup: int
    """Untimed steps before the timed ones."""
    batch: int | None = None
    width: int | None = None
    """MLP width (MLP models only)."""
    workload: str | None = None
    """What one step trains, for the report text: model, config, parameters, batch shapes, optimizer."""
    api: str | None = None
    """``lazy`` on modes rows."""
    execution: str | None = None
    """``mncore.init(execution=...)``: sync, async_naive or async."""
    context_time_kind: str | None = None
    """``time_kind`` of the Context API's measurement (compare rows)."""
    lazy_time_kind: str | None = None
    """``time_kind`` of lazy mode's measurement (compare rows)."""
    lazy_captured_time_kind: str | None = None
    """``time_kind`` of captured lazy mode's measurement (compare rows)."""
    bound: str | None = None
    """``trace-bound`` when host trace > device time, else ``device-bound``."""
    ratio: float | None = None
    """lazy step_ms / Context step_ms (compare rows with both APIs)."""
    captured_ratio: float | None = None
    """captured lazy step_ms / Context step_ms (compare rows with both)."""
    captured_error: str | None = None
    """Why captured lazy mode did not measure; the row's status stays that of lazy and Context."""
    compile_error: str | None = None
    """Peers rows: why torch.compile did not measure (e.g. no C++ compiler); eager's figures stay shown."""
    per_step: dict[str, list[float]] | None = jsonl_only()
    """Per-step step/trace/device/idle ms (modes rows)."""
    timeline_file: str | None = None
    """Timeline of the timed window, relative to the report directory (modes rows)."""
    chrome_trace: str | None = None
    """Chrome/Perfetto trace of the timed window, relative to the report directory (modes rows)."""
    warning: str | None = None
    """Set when the runtime did not run in the simulator mode asked for."""
    traceback: str | None = jsonl_only()
    """The failing measurement's traceback (tail), on ``error`` rows."""
    cell_wall_s: float | None = None
    """Wall time of the cell's child processes (set by the parent)."""
    rounds: int | None = None
    """Compare and peers rows: rounds of one child process per API, interleaved (``harness report --rounds``);
    each API's figures are from its median round."""
    window: Measurement = field(default_factory=Measurement)
    """Written unprefixed: a modes row's lazy run; on compare rows the lazy step's trace and device time."""
    context: Measurement = field(default_factory=Measurement)
    """Written as ``context_*``: the Context API's measurement (compare rows)."""
    lazy: Measurement = field(default_factory=Measurement)
    """Written as ``lazy_*``: lazy mode's measurement (compare rows)."""
    lazy_captured: Measurement = field(default_factory=Measurement)
    """Written as ``lazy_captured_*``: lazy mode with the step in ``mncore.capture`` (compare rows)."""
    eager: Measurement = field(default_factory=Measurement)
    """Written as ``eager_*``: the step in eager PyTorch on the CPU (peers rows, backend ``PEER_BACKEND``)."""
    compile: Measurement = field(default_factory=Measurement)
    """Written as ``compile_*``: the step with the model under ``torch.compile`` (inductor, CPU; peers rows)."""


# the suites over PyTorch's test databases and the database each runs (an OpRow's ``suite`` and ``config``)
DATABASES = {"opinfo": "op_db", "modules": "module_db", "optim": "optim_db"}


@dataclass(kw_only=True)
class OpRow(Row):
    """One op of PyTorch's OpInfo database (or one module of its module database, one optimizer of its
    optimizer database) on one backend, by ``harness run --tier unit --suite opinfo|modules|optim``: its
    first samples checked against eager CPU (always measured wall time). The shared fields read: ``model``
    the op, module or optimizer name (``div.floor_rounding``, ``nn.Linear``, ``Adam``), ``config`` the
    database (``op_db``, ``module_db`` or ``optim_db``), ``steps`` the samples checked.

    ``xfail``: the op fails as its entry in ``ci/expected_op_failures.json`` says; ``xpass``: it has an entry
    but passes (the entry must go); ``fail``/``error``: a mismatch or an exception on the backend without one.
    """

    STATUSES: ClassVar[tuple[str, ...]] = ("pass", "fail", "error", "xfail", "xpass", "eager_fail", "skipped",
                                           "timeout", "crash", "oom")
    suite: str
    """``opinfo``, ``modules`` or ``optim``."""
    checks: str
    """``forward`` or ``forward+backward``."""
    samples_pass: int | None = None
    """Samples whose forward (and backward) matched."""
    samples_noise: int | None = None
    """Of those, samples that matched only by the float64 rule (RMSE vs float64 within 2x eager float32's)."""
    backward: str | None = None
    """``pass``, ``fail`` or ``n/a`` with why (no autograd, a random op, no differentiable output)."""
    failing_sample: str | None = None
    """The first failing sample (index and arguments)."""
    expected_category: str | None = None
    """The category of the op's expected-failure entry, if it has one."""
    repro: str | None = None
    """The command that runs this op alone."""
    wall_s: float | None = None
