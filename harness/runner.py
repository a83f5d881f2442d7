"""Train one zoo model N steps in eager (reference), lazy mode, lazy mode under ``mncore.capture`` and the
Context API; judge and time them.

``run_one`` is executed in a child process per model (``python -m harness.runner``) so that a crash,
an OOM or a hang in one model cannot take a tier run down; it prints one JSON row.
All times are measured wall time on the backend's host (pfvm devices execute real kernels); a step
is timed to its completion on the device (no overlap with the next step's trace: the per-step
counters are read once the step's graphs finished), in lazy mode and with the Context API alike.
The pipelined step times are ``harness report``'s (``harness/perf.py``). The captured mode runs
``CAPTURE_WARMUP`` more steps than the others before its timed ones (capture records before it replays)
and ``CAPTURE_TAIL`` after them: a re-validation (``Captured.check_next``, what every 100th call of a
training loop does) and a call that replays only if the re-validation agreed, so a step that would stop
replaying in a long run shows in the replays per step. Eager runs them all too, so every mode is judged
against the same eager run.
"""
from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from reports.schema import CapturedResult, ModelRow, ModeResult

# Model-level agreement: same maths, but kernels and optimizer forms (foreach vs for-loop) may order
# float32 sums differently and errors grow over steps, so float32 tolerances are widened 100x; where
# that is not enough, a float64 golden run decides (harness.compare.compare_with_fp64).
TOLERANCE_SCALE = 100.0
TOLERANCE_REASON = "model level: float32 summation order differs (foreach vs for-loop optimizers), grows over steps"
# mncore.capture replays from its fourth call: the first records, the second is a new call key (now
# with gradients and optimizer state), the third records again and agrees with the second.
CAPTURE_WARMUP = 3
CAPTURE_TAIL = 2  # after the timed steps: a re-validation, then a call that replays if it agreed
_DROPOUT_WORDS = ("dropout", "pdrop", "drop_prob", "layerdrop")  # rates: attention_dropout, residual_dropout,
# attn_pdrop, transformers' DropPath drop_prob, ...
# mixture-of-experts routers (Switch, Mixtral) scale their input by noise; masked autoencoders (ViT-MAE,
# Hiera) hide a random share of the patches (`mask_ratio`) on every call
_NOISE_ATTRS = ("jitter_noise", "mask_ratio")
_CONFIG_NOISE = ("mask_time_prob", "mask_feature_prob", "mask_ratio")  # and speech models' SpecAugment masks
# random augmentations of rotary positions' coordinates in training (DINOv3's RoPE): None switches them off
_CONFIG_AUGMENT = ("pos_embed_shift", "pos_embed_jitter", "pos_embed_rescale")


def _zero_rates(obj: object, extra: tuple[str, ...]) -> None:
    for attr, value in list(vars(obj).items()):
        if type(value) is float and (attr in extra or any(w in attr for w in _DROPOUT_WORDS)):
            setattr(obj, attr, 0.0)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Random streams differ between eager CPU and the device, so accuracy runs switch off what is random in
    training: dropout layers, stochastic depth (torchvision's ``StochasticDepth``, transformers' DropPath
    modules, which drop whole residual branches per sample), router jitter noise, the rates modules keep as
    float attributes for ``F.dropout`` (any attribute named like a dropout rate: Seed-OSS's
    ``residual_dropout``), and the same rates, SpecAugment mask probabilities and masked autoencoders'
    mask ratios in transformers' configs, which some layers read while training (wav2vec2's ``layerdrop``,
    HuBERT's ``mask_time_prob``, ViT-MAE's ``mask_ratio``: with none masked, its random patch order no
    longer changes the loss), and the random shift, jitter and rescale of DINOv3's rotary coordinates."""
    from torchvision.ops import StochasticDepth  # here: the CLI starts without importing torchvision

    configs = {}
    for m in model.modules():
        if isinstance(m, (torch.nn.modules.dropout._DropoutNd, StochasticDepth)):
            m.p = 0.0
        _zero_rates(m, _NOISE_ATTRS)
        cfg = getattr(m, "config", None)
        if cfg is not None and not isinstance(cfg, (torch.nn.Module, dict)) and hasattr(cfg, "__dict__"):
            configs[id(cfg)] = cfg
    for cfg in configs.values():
        _zero_rates(cfg, _CONFIG_NOISE)
        for attr in _CONFIG_AUGMENT:
            if getattr(cfg, attr, None) is not None:
                setattr(cfg, attr, None)
    return model


def repro_command(model: str, config: str, backend: str, steps: int) -> str:
    return f"python -m harness.runner --model {model} --config {config} --backend {backend} --steps {steps}"


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _median_after_first(times: list[float]) -> float:
    rest = times[1:] or times
    return statistics.median(rest) * 1e3


def run_eager(spec: Any, config: str, steps: int, seed: int, dtype: torch.dtype | None = None,
              keep: tuple[int, ...] = ()) -> dict:
    """Eager CPU training; ``dtype=torch.float64`` gives the golden reference for accuracy verdicts.
    ``keep``: step counts whose losses and state are kept too (``at[n]``), to judge modes that ran fewer steps."""
    import model_zoo

    model = disable_dropout(spec.build(config, seed=seed))
    if dtype is not None:
        model = model.to(dtype)
    opt = spec.optimizer(model.parameters())
    losses, times, at = [], [], {}
    for step in range(steps):
        batch = spec.make_batch(config, seed=seed + step)
        if dtype is not None:
            batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
        t0 = time.perf_counter()
        loss = model_zoo.train_step(spec, model, opt, batch)
        losses.append(float(loss.detach()))
        times.append(time.perf_counter() - t0)
        if step + 1 in keep:
            at[step + 1] = {"losses": list(losses), "state": _state(model)}
    return {"losses": losses, "state": _state(model), "step_ms": _median_after_first(times), "at": at}


def _first(run: dict, steps: int) -> dict:
    """The losses and state of an eager ``run`` after its first ``steps`` steps (kept with ``keep``)."""
    return run if len(run["losses"]) == steps else run["at"][steps]


def capturable(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Adam and AdamW with ``capturable=True`` (bias corrections on the device, the same maths), as
    mncore.capture's warning tells a user to write: without it they are host numbers that change every
    step, and capture refuses the step."""
    if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
        for group in opt.param_groups:
            group["capturable"] = True
    return opt


@contextmanager
def capture_warnings() -> Iterator[list[str]]:
    """The messages of the ``CaptureWarning``s raised inside (each once); other warnings pass through."""
    from mncore.errors import CaptureWarning

    seen: list[str] = []
    show = warnings.showwarning

    def keep(message: Any, category: type, *rest: Any, **kw: Any) -> None:
        if not issubclass(category, CaptureWarning):
            show(message, category, *rest, **kw)
        elif str(message) not in seen:
            seen.append(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always", CaptureWarning)
        warnings.showwarning = keep
        yield seen


def run_lazy(spec: Any, config: str, backend: str, steps: int, seed: int, capture: bool = False) -> dict:
    """Lazy mode; ``capture``: the step wrapped in ``mncore.capture``, whose first ``CAPTURE_WARMUP`` steps
    (its recordings) are left out of the step time and the replays per step, and whose last
    ``CAPTURE_TAIL`` steps are a re-validation (left out of both) and a call counted in the replays only."""
    import mncore
    import model_zoo

    mncore.init(backend, implicit_sync="silent")
    mncore.metrics.reset()
    model = disable_dropout(spec.build(config, seed=seed)).to("mncore")
    opt = spec.optimizer(model.parameters())
    if capture:
        capturable(opt)
    train: Callable = lambda batch: model_zoo.train_step(spec, model, opt, batch)  # noqa: E731
    step = mncore.capture(train) if capture else train
    batches = [model_zoo.batch_to(spec.make_batch(config, seed=seed + s), "cpu") for s in range(steps)]
    losses, times, per_step, peak = [], [], [], 0
    t_prev = time.perf_counter()
    with capture_warnings() as refused:
        for i, batch in enumerate(batches):
            if capture and i == len(batches) - CAPTURE_TAIL:
                step.check_next()
            c0 = mncore.metrics.counters()
            loss = step(model_zoo.batch_to(batch, "mncore"))
            mncore.sync()
            losses.append(loss.detach())
            # The worker counts a graph (and may compile) after an async sync() returns: read the counters
            # only once the step's graphs have finished, or a step counts 0 or 2 graphs at random.
            mncore.wait_device_ops()
            c1 = mncore.metrics.counters()
            per_step.append({k: c1[k] - c0[k] for k in ("compiles", "graphs_executed", "cache_hits", "implicit_syncs",
                                                          "trace_s", "sync_s", "compile_s", "fallback_ops", "replays")})
            now = time.perf_counter()
            times.append(now - t_prev)
            t_prev = now
            peak = max(peak, mncore.observe.live_bytes())
    last = per_step[-1]
    out = {
        "losses": [float(l.cpu()) for l in losses], "state": _state(model), "step_ms": _median_after_first(times),
        "trace_ms": statistics.median((s["trace_s"] + s["sync_s"]) * 1e3 for s in per_step[1:] or per_step),
        "compile_s": sum(s["compile_s"] for s in per_step), "graphs_per_step": last["graphs_executed"],
        "compiles_after_warmup": sum(s["compiles"] for s in per_step[2:]),
        "cache_hits": sum(s["cache_hits"] for s in per_step), "implicit_syncs_per_step": last["implicit_syncs"],
        "fallback_ops_per_step": last["fallback_ops"], "peak_device_bytes": peak,
    }
    if capture:
        skip, end = CAPTURE_WARMUP, steps - CAPTURE_TAIL
        if end <= skip:
            raise ValueError(f"a captured run needs more than {CAPTURE_WARMUP + CAPTURE_TAIL} steps, got {steps}")
        counted = per_step[skip:end] + per_step[-1:]  # the timed steps and the call after the re-validation
        out.update(warmup=skip, replays_per_step=sum(s["replays"] for s in counted) / len(counted),
                   retraces=mncore.metrics.capture_retraces(), refused="; ".join(refused),
                   step_ms=statistics.median(times[skip:end]) * 1e3)
    return out


def context_step(spec: Any, model: torch.nn.Module, device: Any) -> tuple[Any, Any]:
    """A new Context on ``device`` with ``model``'s parameters, buffers and optimizer state registered
    (MLSDK style); returns the context and the ``dict -> dict`` training step to compile."""
    import model_zoo
    from mncore.context import Context, prepare_for_compile, set_buffer_name_in_optimizer, set_tensor_name_in_module

    ctx = Context(device)
    Context.switch_context(ctx)
    opt = prepare_for_compile(spec.optimizer(model.parameters()))
    set_tensor_name_in_module(model, "model")
    set_buffer_name_in_optimizer(opt, "opt")
    for p in model.parameters():
        ctx.register_param(p)
    for _, b in model.named_buffers(remove_duplicate=True):
        ctx.register_buffer(b)
    ctx.register_optimizer_buffers(opt)

    def step_fn(batch: dict) -> dict:
        return {"loss": model_zoo.train_step(spec, model, opt, batch)}

    return ctx, step_fn


def run_context(spec: Any, config: str, backend: str, steps: int, seed: int) -> dict:
    from mncore.context import MNDevice

    model = disable_dropout(spec.build(config, seed=seed))
    ctx, step_fn = context_step(spec, model, MNDevice(backend))
    batches = [spec.make_batch(config, seed=seed + s) for s in range(steps)]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # frozen-constant notices (e.g. HF position buffers)
            compiled = ctx.compile(step_fn, batches[0], Path(tmp) / "step")
    compile_s = time.perf_counter() - t0
    outs, times = [], []
    t_prev = time.perf_counter()
    for batch in batches:
        outs.append(compiled(batch)["loss"])
        ctx.synchronize()  # each step to its completion, as lazy mode's (whose counters need it)
        now = time.perf_counter()
        times.append(now - t_prev)
        t_prev = now
    losses = [o.item() for o in outs]
    return {"losses": losses, "state": _state(model), "step_ms": _median_after_first(times), "compile_s": compile_s}


def _agreement(ref: dict, got: dict, golden: dict | None = None) -> tuple[bool, str, float]:
    """Losses and final state vs eager float32 (widened float32 tolerances); where they differ, the
    float64 golden run decides (``compare_with_fp64``) whether the backend or float32 chaos drifted."""
    from harness.compare import compare, compare_with_fp64

    def judge(actual: torch.Tensor, eager: torch.Tensor, gold: torch.Tensor | None, path: str):
        v = compare(actual, eager, scale=TOLERANCE_SCALE, reason=TOLERANCE_REASON, path=path)
        if v or gold is None or not eager.is_floating_point():
            return v
        return compare_with_fp64(actual, eager, gold, path=path)

    gold = golden or {}
    v = judge(torch.tensor(got["losses"]), torch.tensor(ref["losses"]),
              torch.tensor(gold["losses"], dtype=torch.float64) if gold else None, "losses")
    if not v:
        return False, v.message, v.max_abs
    worst = 0.0
    for k, t in ref["state"].items():
        pv = judge(got["state"][k], t, gold["state"].get(k) if gold else None, f"param {k}")
        if not pv:
            return False, pv.message, pv.max_abs
        worst = max(worst, pv.max_abs)
    return True, "", worst


def _classify(exc: BaseException) -> str:
    from mncore.errors import NotCompilableError

    if isinstance(exc, NotCompilableError):
        return "not_compilable"
    text = f"{type(exc).__name__}: {exc}"
    return "oom" if isinstance(exc, MemoryError) or "out of memory" in text.lower() else "fail_to_run"


def _portable(text: str) -> str:
    """``text`` with the checkout's and the installation's directories taken off the file names in it:
    an expected reason (``ci/expected``) must read the same on every machine."""
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")} | {str(Path(__file__).parent.parent)}
    for d in sorted(dirs, key=len, reverse=True):
        text = text.replace(d.rstrip(os.sep) + os.sep, "")
    return text


def _reason(exc: BaseException) -> str:
    """The exception's type and message, portable, cut at 500 characters of message after the directories
    are taken off: cut before, a checkout or installation at a longer path kept less of the message, and
    the expected reason of another machine did not match."""
    return f"{type(exc).__name__}: {_portable(str(exc))[:500]}"


def _fail(row: ModelRow, mode: str, status: str, reason: str, tb: str | None = None, sep: str = ": ") -> None:
    """A mode did not pass: the mode says so itself (``lazy_status``, ...); the row takes the first failure
    only, so a later mode never hides an earlier one's result."""
    result = getattr(row, mode)
    result.status, result.reason = status, reason
    if row.status == "pass":
        row.status, row.reason, row.traceback = status, f"{mode}{sep}{reason}", tb


def _record(row: ModelRow, mode: str, res: dict, err: float) -> None:
    """A finished mode's figures into the row (lazy mode's graph, cache and sync figures unprefixed)."""
    figures = {"losses": res["losses"], "step_ms": res["step_ms"], "param_max_abs_err": err,
               "compile_s": res["compile_s"]}
    if mode == "lazy_captured":
        row.lazy_captured = CapturedResult(**figures, status="pass", reason=res["refused"], warmup=res["warmup"],
                                           replays_per_step=res["replays_per_step"], retraces=res["retraces"] or None)
        return
    setattr(row, mode, ModeResult(**figures, status="pass"))
    for name, value in res.items():
        if name not in ("losses", "state", "step_ms", "compile_s"):
            setattr(row, name, value)


def _crashed(row: ModelRow) -> ModelRow:
    """The row as it stands, should the process die while the captured mode runs (the lazy and Context
    results are kept)."""
    crashed = copy.deepcopy(row)
    _fail(crashed, "lazy_captured", "fail_to_run", "the process ended while lazy_captured ran (see the log)")
    return crashed


def run_one(model: str, config: str, backend: str, steps: int, seed: int = 0,
            checkpoint: Callable[[ModelRow], None] | None = None) -> ModelRow:
    """One row: every field of the results file for ``model`` on ``backend``. ``checkpoint`` gets the row
    before the captured mode runs (the last mode: a crash there must not lose the others)."""
    import mncore
    import model_zoo

    row = ModelRow(model=model, config=config, backend=backend, steps=steps, time_kind="measured wall time",
                   status="pass", reason="", repro=repro_command(model, config, backend, steps))
    try:
        spec = model_zoo.get(model)
        row.family = spec.family
        mncore.parse_device(backend)
    except (KeyError, ValueError) as e:
        row.status, row.reason = "skipped", str(e).strip("'\"")
        return row
    total = steps + CAPTURE_WARMUP + CAPTURE_TAIL
    try:
        eager = run_eager(spec, config, total, seed, keep=(steps,))
    except Exception as e:  # noqa: BLE001 - the row records it
        row.status, row.reason = "eager_fail", f"{type(e).__name__}: {e}"
        row.traceback = traceback.format_exc()[-2000:]
        return row
    row.params = sum(t.numel() for t in eager["state"].values())
    row.eager_losses, row.eager_step_ms = eager["losses"], eager["step_ms"]
    golden: dict | None = None
    for mode, n, fn in (("lazy", steps, lambda: run_lazy(spec, config, backend, steps, seed)),
                        ("context", steps, lambda: run_context(spec, config, backend, steps, seed)),
                        ("lazy_captured", total, lambda: run_lazy(spec, config, backend, total, seed, capture=True))):
        if mode == "lazy_captured" and checkpoint is not None:
            checkpoint(_crashed(row))
        try:
            res = fn()
        except Exception as e:  # noqa: BLE001 - the row records it
            _fail(row, mode, _classify(e), _reason(e),
                  traceback.format_exc()[-2000:])
            continue
        ok, why, err = _agreement(_first(eager, n), res)
        if not ok:  # float32 may drift chaotically: let a float64 golden run decide
            golden = golden or run_eager(spec, config, total, seed, dtype=torch.float64, keep=(steps,))
            ok, why, err = _agreement(_first(eager, n), res, _first(golden, n))
        _record(row, mode, res, err)
        if not ok:
            _fail(row, mode, "fail_accuracy", why[:500], sep=" vs eager: ")
    if row.context.step_ms:
        if row.lazy.step_ms:
            row.lazy_context_ratio = row.lazy.step_ms / row.context.step_ms
        if row.lazy_captured.step_ms:
            row.captured_context_ratio = row.lazy_captured.step_ms / row.context.step_ms
    return row


def main(argv: list[str] | None = None) -> int:
    import argparse

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ap = argparse.ArgumentParser(
        description="run one zoo model in eager, lazy, captured lazy and Context modes (one JSON row)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--backend", default="pfvm:cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the row here (JSON) instead of stdout")
    a = ap.parse_args(argv)
    import mncore  # noqa: F401  (register the device before autograd's engine starts)

    def write(row: ModelRow) -> None:
        text = json.dumps(row.to_json())
        if a.out:
            a.out.write_text(text)
        else:
            print(text)

    row = run_one(a.model, a.config, a.backend, a.steps, a.seed, checkpoint=write if a.out else None)
    write(row)
    return 0 if row.status in ("pass", "skipped", "not_compilable") else 1


if __name__ == "__main__":
    sys.exit(main())
