"""The checks a case runs against (inside the worker process); eager PyTorch on CPU is the reference.

- ``lazy_vs_eager``: the op on ``mncore`` tensors in lazy mode vs eagerly on CPU, outputs and
  written arguments, judged by ``harness.compare.compare`` with its default tolerances (random ops:
  metadata only; sort-like ops: values, not tie order), as the generated op tests do.
- ``context_vs_lazy``: a ``dict -> dict`` function wrapping the op, compiled with the Context API,
  vs lazy mode (run only once lazy mode agrees with eager, so it checks the Context path itself).
- ``captured_vs_lazy``: the op as a step under ``mncore.capture``, recorded on scaled values and
  replayed on the case's own, vs lazy mode (a replay that reads or returns stale values disagrees).
- ``grad_vs_eager``: gradients of a fixed random weighting of the float outputs w.r.t. the float
  inputs, lazy vs eager (functional, differentiable ops only).
- invalid inputs (eager raises): mncore must raise a Python exception too; any exception passes.

A float mismatch is reported only if a float64 run says it is not noise: mncore's RMSE against
float64 must exceed twice eager's own (``harness.compare.compare_with_fp64``; the ∇Fuzz/NNSmith
lesson that ill-conditioned cases otherwise flood a fuzzer with false alarms). Such cases are
counted as ``unstable``. No tolerance is widened. On a simulated board, a matmul-class op whose
operands the board reads in its own half format is also judged against a float64 run on operands
rounded to that format (``harness.fuzz.board_format``); within twice eager's error of it is
``board-format``.
"""
from __future__ import annotations

import contextlib
import math
import time
import traceback
import warnings
from typing import Any, Callable, Iterator

import torch

import mncore
from mncore.errors import CaptureWarning, NotCompilableError
from harness.compare import Verdict, compare, compare_with_fp64
from harness.fuzz.board_format import board_reference, operand_format, round_to
from harness.fuzz.cases import Case
from harness.opgen import _extent, clone, index_outputs_unstable, is_random, resolve_op, to_device

ORACLES = ("lazy_vs_eager", "context_vs_lazy", "captured_vs_lazy", "grad_vs_eager")
_LOW_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


class NotApplicable(Exception):
    """The oracle does not apply to this op or case (the reason is recorded, nothing failed)."""


def to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(a) for a in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def flatten(x: Any, prefix: str = "out") -> dict[str, Any]:
    """Nested outputs as ``{"out": t}`` or ``{"out.0": t0, "out.1": t1}`` (Nones and numbers kept)."""
    if isinstance(x, (list, tuple)):
        out: dict[str, Any] = {}
        for i, a in enumerate(x):
            out.update(flatten(a, f"{prefix}.{i}"))
        return out
    return {prefix: x}


def written(op: Any) -> list[tuple[int, str]]:
    """(position, name) of arguments the op writes (in-place and ``out=`` ops)."""
    return [(i, a.name) for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _written_values(op: Any, args: list, kwargs: dict) -> dict[str, Any]:
    out = {}
    for i, name in written(op):
        if name in kwargs:
            out[f"arg:{name}"] = kwargs[name]
        elif i < len(args):
            out[f"arg:{name}"] = args[i]
    return out


def result_dict(op: Any, out: Any, args: list, kwargs: dict) -> dict[str, torch.Tensor]:
    """Outputs and written arguments as one flat dict of tensors (what the Context oracle returns)."""
    res = dict(flatten(out), **_written_values(op, args, kwargs))
    return {k: v for k, v in res.items() if isinstance(v, torch.Tensor)}


# -- running the op --------------------------------------------------------------------------------
@contextlib.contextmanager
def drained() -> Iterator[None]:
    """On an error, also collect the device errors still pending, so they cannot leak into the next case."""
    try:
        yield
    except BaseException:
        try:
            mncore.wait_device_ops()
        except Exception:  # noqa: BLE001 - the same failure, reported a second time
            pass
        raise


def eager_call(op: Any, args: list, kwargs: dict) -> tuple[Any, list, dict]:
    """The reference: the op on copies of the CPU inputs; returns (outputs, args, kwargs) after the call."""
    a, k = clone(args), clone(kwargs)
    return op(*a, **k), a, k


def lazy_call(op: Any, args: list, kwargs: dict) -> tuple[Any, list, dict]:
    """The op traced on ``mncore`` copies, run at ``sync()``; everything read back to the CPU."""
    with drained():  # an upload copies (``to_device``): the CPU arguments stay as they were
        return lazy_run(op, to_device(args, "mncore"), to_device(kwargs, "mncore"))


def lazy_run(op: Any, args: list, kwargs: dict, call: Callable | None = None) -> tuple[Any, list, dict]:
    """The op traced on arguments already on ``mncore``, run at ``sync()``; the outputs and the arguments
    the op writes read back to the CPU (the others are returned as they were: nothing judges them).
    ``call`` runs in the op's place (a captured step that calls it on these arguments).

    ``wait_device_ops`` is part of the call so that an error of a graph nobody reads surfaces here,
    in this case, not in the next one.
    """
    writes = written(op)
    at, names = {i for i, _ in writes}, {n for _, n in writes}
    with drained():
        out = (call or op)(*args, **kwargs)
        mncore.sync()
        out = to_cpu(out)
        a = [to_cpu(x) if i in at else x for i, x in enumerate(args)]
        k = {n: to_cpu(v) if n in names else v for n, v in kwargs.items()}
        mncore.wait_device_ops()
    return out, a, k


def _holes(args: list, kwargs: dict) -> tuple[dict[str, torch.Tensor], list, dict]:
    """Copies of the tensors of ``args`` and ``kwargs`` (lists of tensors walked) by path, and both with each
    tensor replaced by a placeholder that ``_fill`` swaps for a value of the same path; devices moved to mncore."""
    inputs: dict[str, torch.Tensor] = {}

    def hole(x: Any, path: str) -> Any:
        if isinstance(x, torch.Tensor):
            inputs[path] = x
            return ("__input__", path)
        if isinstance(x, list):
            return [hole(v, f"{path}.{i}") for i, v in enumerate(x)]
        return to_device(x, "mncore")

    t_args = [hole(a, f"a{i}") for i, a in enumerate(clone(args))]
    t_kwargs = {k: hole(v, f"k:{k}") for k, v in clone(kwargs).items()}
    return inputs, t_args, t_kwargs


def _fill(x: Any, feed: dict) -> Any:
    if isinstance(x, tuple) and len(x) == 2 and x[0] == "__input__":
        return feed[x[1]]
    if isinstance(x, list):
        return [_fill(v, feed) for v in x]
    if isinstance(x, dict):
        return {k: _fill(v, feed) for k, v in x.items()}
    return x


def context_call(op: Any, args: list, kwargs: dict, context: Any,
                 codegen_dir: str) -> tuple[dict[str, torch.Tensor], dict[str, tuple[list, torch.dtype]]]:
    """The op wrapped in a ``dict -> dict`` function, compiled with the Context API and called once.

    Returns the outputs read back to the host and what their ``TensorProxy`` objects report
    (shape, dtype), which must agree.
    """
    inputs, t_args, t_kwargs = _holes(args, kwargs)

    def step(feed: dict) -> dict:
        a, k = _fill(t_args, feed), _fill(t_kwargs, feed)
        return result_dict(op, op(*a, **k), a, k)

    if not inputs:
        raise NotApplicable("no tensor inputs")
    with drained():
        compiled = context.compile(step, inputs, codegen_dir)
        proxies = compiled(inputs)
        return {k: v.cpu() for k, v in proxies.items()}, {k: (list(v.shape), v.dtype) for k, v in proxies.items()}


def captured_call(op: Any, args: list, kwargs: dict, seed: int) -> tuple[Any, list, dict]:
    """The op as a step function under ``mncore.capture``, as a training loop calls one: two calls on
    the inputs with their float values scaled down (the same shapes, dtypes and strides: the same call
    key) record it, a third on the case's own inputs replays the recorded graph. Returns that call's outputs
    and written arguments read back, as ``lazy_call`` does; a replay that returned a recording's values
    or left an argument unwritten then disagrees with lazy mode. ``NotApplicable`` where capture keeps
    tracing the step instead (its warning says why) or the op rejects the scaled values in lazy mode too.
    """
    inputs, t_args, t_kwargs = _holes(args, kwargs)
    if not inputs:
        raise NotApplicable("no tensor inputs")
    g = torch.Generator().manual_seed(seed)
    step = mncore.capture(lambda feed: op(*_fill(t_args, feed), **_fill(t_kwargs, feed)))
    with drained(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", CaptureWarning)
        for low in (0.5, 0.7):  # two recordings, on values that differ from each other and from the case's
            factor = low + 0.2 * torch.rand((), generator=g).item()
            feed = to_device({k: _scaled(v, factor) for k, v in inputs.items()}, "mncore")
            try:
                step(feed)
                mncore.wait_device_ops()
            except Exception:
                try:
                    lazy_run(op, _fill(t_args, feed), _fill(t_kwargs, feed))
                except Exception as e:  # noqa: BLE001 - values the op rejects
                    raise NotApplicable(f"lazy mode raises on the scaled values too ({type(e).__name__})") from None
                raise
        feed = to_device(inputs, "mncore")
        before = mncore.metrics.counters()["replays"]
        result = lazy_run(op, _fill(t_args, feed), _fill(t_kwargs, feed), call=lambda *a, **k: step(feed))
        if mncore.metrics.counters()["replays"] == before:
            why = next((str(w.message) for w in seen if issubclass(w.category, CaptureWarning)), "no warning")
            raise NotApplicable(f"capture did not replay the step: {why.split('this step: ')[-1].split('. It keeps')[0]}")
    return result


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    """A copy of ``t`` in the same layout with its float values times ``factor`` (in (0, 1): signs, ranges
    such as [0, 1], order and positive definiteness kept); integer and bool tensors (indices, offsets,
    masks) are copied as they are."""
    n = _extent(list(t.shape), list(t.stride()))
    flat = t.as_strided([n], [1]).clone()
    if t.is_floating_point() or t.is_complex():
        flat.mul_(factor)
    return flat.as_strided(t.shape, t.stride())


def grads(op: Any, args: list, kwargs: dict, device: str, weight_seed: int,
          weights_as: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor | None]:
    """d(sum_i w_i * out_i)/d(float inputs), with fixed random weights ``w_i``; on CPU or ``mncore``.
    ``weights_as`` maps the float64 weights before use (a reference that rounds them as a board would)."""
    with drained():
        return _grads(op, args, kwargs, device, weight_seed, weights_as)


def _grads(op: Any, args: list, kwargs: dict, device: str, weight_seed: int,
           weights_as: Callable[[torch.Tensor], torch.Tensor] | None) -> list[torch.Tensor | None]:
    a, k = clone(args), clone(kwargs)
    if device != "cpu":
        a, k = to_device(a, device), to_device(k, device)
    leaves: list[torch.Tensor] = []

    def mark(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.detach().requires_grad_()
            leaves.append(x)
            return x
        if isinstance(x, list):
            return [mark(v) for v in x]
        return x

    a, k = [mark(x) for x in a], {n: mark(v) for n, v in k.items()}
    outs = [t for t in flatten(op(*a, **k)).values()
            if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    if not outs:
        raise NotApplicable("no differentiable float output")
    g = torch.Generator().manual_seed(weight_seed)
    # Weights drawn in float64 then cast, so a float64 rerun (the noise filter) uses the same ones.
    weights = [torch.randn(o.shape, generator=g, dtype=torch.float64) for o in outs]
    if weights_as is not None:
        weights = [weights_as(w) for w in weights]
    loss = sum((o * w.to(o.dtype).to(o.device)).sum() for o, w in zip(outs, weights))
    res = torch.autograd.grad(loss, leaves, allow_unused=True)
    if device != "cpu":
        res = to_cpu(list(res))
        mncore.wait_device_ops()
    return list(res)


def show(got: Any, want: Any, limit: int = 64) -> None:
    """Print small mismatching results side by side (repro scripts call it before failing)."""
    gs, ws = flatten(got), flatten(want)
    for k, w in ws.items():
        g = gs.get(k)
        if isinstance(w, torch.Tensor) and w.numel() <= limit:
            print(f"{k}: eager  {w.tolist()}\n{k}: mncore {g.tolist() if isinstance(g, torch.Tensor) else g}")


# -- judging ----------------------------------------------------------------------------------------
def _unstable_pairs(op_name: str, got: Any, want: Any) -> tuple[Any, Any]:
    """Sort-like ops may order ties differently: only their values are compared."""
    if index_outputs_unstable(op_name) and isinstance(want, tuple):
        return got[0], want[0]
    return got, want


def judge(op_name: str, got: Any, want: Any, got_args: list, got_kwargs: dict, want_args: list,
          want_kwargs: dict) -> Verdict:
    """Outputs and written arguments of mncore vs eager (the generated op tests' rule)."""
    op = resolve_op(op_name)
    meta_only = is_random(op)
    g, w = _unstable_pairs(op_name, got, want)
    verdict = compare(g, w, meta_only=meta_only)
    if not verdict:
        return verdict
    mine, ref = _written_values(op, got_args, got_kwargs), _written_values(op, want_args, want_kwargs)
    for name in ref:
        v = compare(mine.get(name), ref[name], meta_only=meta_only, path=name)
        if not v:
            return v
    return verdict


def judge_dicts(op_name: str, got: dict, want: dict) -> Verdict:
    """Two flattened result dicts (Context vs lazy): same keys, each value by ``compare``."""
    if sorted(got) != sorted(want):
        return Verdict(False, f"outputs differ: got keys {sorted(got)}, expected {sorted(want)}")
    op = resolve_op(op_name)
    keys = sorted(want)
    if index_outputs_unstable(op_name) and len(keys) > 1 and "out.0" in keys:
        keys = ["out.0"] + [k for k in keys if k.startswith("arg:")]
    for k in keys:
        v = compare(got[k], want[k], meta_only=is_random(op), path=k)
        if not v:
            return v
    return Verdict(True)


def to_double(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in _LOW_FLOATS:
        return x.double()
    if isinstance(x, list):
        return [to_double(a) for a in x]
    if isinstance(x, dict):
        return {k: to_double(v) for k, v in x.items()}
    return x


def is_noise(got: Any, want: Any, reference: Callable[[], Any]) -> bool:
    """True if every float result of mncore is within 2x eager's own error against a float64 run (where that
    run is finite; elsewhere mncore must give eager's inf or NaN)."""
    try:
        ref = reference()
    except Exception:  # noqa: BLE001 - no float64 kernel: the mismatch stands
        return False
    gs, ws, rs = flatten(got), flatten(want), flatten(ref)
    if gs.keys() != ws.keys() or ws.keys() != rs.keys():
        return False
    for k in ws:
        g, w, r = gs[k], ws[k], rs[k]
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, torch.Tensor) or not isinstance(r, torch.Tensor) or (g.shape, g.dtype) != (w.shape, w.dtype):
            return False  # metadata differences are never noise
        if not w.is_floating_point():
            if not torch.equal(g, w):
                return False
            continue
        if r.shape != w.shape:
            return False
        # where the float64 run is inf or NaN, mncore must give eager's value; the error is judged elsewhere
        odd = ~torch.isfinite(r)
        if odd.any() and not compare(g[odd], w[odd], path=k):
            return False
        if not compare_with_fp64(g[~odd], w[~odd], r[~odd]):
            return False
    return True


def meta_call(op: Any, args: list, kwargs: dict) -> Any:
    """The op on ``meta`` tensors: PyTorch's own shape/dtype rules, which mncore's tracer also uses."""
    return op(*to_device(clone(args), "meta"), **to_device(clone(kwargs), "meta"))


def _same_meta(a: Any, b: Any) -> bool:
    fa, fb = flatten(a), flatten(b)
    if fa.keys() != fb.keys():
        return False
    return all(not isinstance(y, torch.Tensor) or (isinstance(x, torch.Tensor) and x.shape == y.shape
                                                   and x.dtype == y.dtype) for x, y in zip(fa.values(), fb.values()))


UNDEFINED = "eager CPU reads memory outside its inputs"


def _fenced(x: Any) -> Any:
    """The same values and layout in new storage with a sentinel-filled margin on both sides."""
    if isinstance(x, list):
        return [_fenced(a) for a in x]
    if isinstance(x, dict):
        return {k: _fenced(v) for k, v in x.items()}
    if not isinstance(x, torch.Tensor) or x.numel() == 0:
        return x
    n = _extent(list(x.shape), list(x.stride()))
    pad = n + 64
    if x.is_floating_point() or x.is_complex():
        fill: Any = float("nan")
    elif x.dtype == torch.bool:
        fill = True
    else:
        fill = torch.iinfo(x.dtype).max
    big = torch.full((n + 2 * pad,), fill, dtype=x.dtype)
    big[pad:pad + n] = x.as_strided([n], [1], x.storage_offset())
    return big.as_strided(x.shape, x.stride(), pad)


# CPU kernels that trust their arguments' sizes: given a smaller tensor they read or write past it, and the
# worker may die later, in another phase. Fused optimizer steps: their leading lists hold one tensor per
# parameter. (mncore refuses these calls; this is the fuzzer's own statement of eager's limits.)
_PER_PARAMETER = {"_fused_adam": 5, "_fused_adamw": 5, "_fused_sgd": 3, "_fused_adagrad": 3}


def _short_channels(op: Any, name: str, args: list) -> str:
    """Batch norm's CPU kernels take one value per channel from the affine tensors and the statistics
    they use (training: the saved ones in backward), and training forward writes the running ones; the
    backward kernels read grad_out as the input's values."""
    if "batch_norm" not in name:
        return ""
    a = dict(zip((s.name for s in op._schema.arguments), args))
    x = a.get("input")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return ""
    used = ["weight", "bias", "running_mean", "running_var"]
    if "backward" in name:
        used = ["weight"] + (["save_mean", "save_invstd", "save_var"] if a.get("train", a.get("update"))
                             else ["running_mean", "running_var"])
        if isinstance(a.get("grad_out"), torch.Tensor) and a["grad_out"].numel() < x.numel():
            return f"{name}: grad_out holds fewer values than the input"
    for arg in used:
        if isinstance(a.get(arg), torch.Tensor) and a[arg].numel() < x.shape[1]:
            return f"{name}: {arg} holds fewer values than the input has channels"
    return ""


def _ctc_past_ends(name: str, args: list) -> str:
    """CPU's CTC kernels index log_probs and their gradient by the used target labels, and the backward op
    writes each sequence's states into a tensor shaped like log_alpha, trusting both (the forward op checks
    the lengths itself)."""
    backward = name == "_ctc_loss_backward"
    if name not in ("_ctc_loss", "_ctc_loss_backward") or len(args) < 4 + 3 * backward:
        return ""
    log_probs, targets, ins, outs = args[backward:4 + backward]
    if log_probs.dim() != 3 or targets.dim() not in (1, 2):
        return ""
    ins, outs = [torch.as_tensor(v).reshape(-1).tolist() for v in (ins, outs)]
    room = targets.shape[1] if targets.dim() == 2 else targets.numel()
    wanted = max(outs, default=0) if targets.dim() == 2 else sum(outs)
    batch = log_probs.shape[1]
    if (len(ins) != batch or len(outs) != batch or min(outs, default=0) < 0 or wanted > room
            or max(ins, default=0) > log_probs.shape[0]):
        return "ctc_loss_backward: lengths unlike the batch or the targets" if backward else ""
    if targets.dim() == 2:
        labels = [v for row, n in zip(targets.tolist(), outs) for v in row[:n]]
    else:
        labels = targets[:sum(outs)].tolist()
    if any(not 0 <= v < log_probs.shape[2] for v in labels):
        return "ctc_loss: a target label is not a class of log_probs"
    if backward:
        need = [log_probs.shape[1], max(ins, default=0), 2 * max(outs, default=0) + 1]
        if args[6].dim() != 3 or any(h < n for h, n in zip(args[6].shape, need)):
            return "ctc_loss_backward: log_alpha smaller than the targets need"
        if min(args[0].numel(), args[5].numel()) < batch:  # one per sequence, read by its number
            return "ctc_loss_backward: grad or neg_log_likelihood holds fewer values than the batch has sequences"
    return ""


# Embedding backward ops: (position of the indices, of num_weights); they scatter into num_weights rows.
_EMBEDDING_ROWS = {"embedding_dense_backward": (1, 2), "_embedding_bag_backward": (1, 6),
                   "_embedding_bag_dense_backward": (1, 5)}


# Max-pooling backward ops: (position of the indices, dimensions of a plane); they scatter into each plane.
_POOL_INDICES = {"max_pool2d_with_indices_backward": (7, 2), "max_pool3d_with_indices_backward": (7, 3),
                 "adaptive_max_pool2d_backward": (2, 2), "adaptive_max_pool3d_backward": (2, 3),
                 "fractional_max_pool2d_backward": (4, 2), "fractional_max_pool3d_backward": (4, 3)}


def _attention_unfit(name: str, args: list) -> str:
    """CPU's flash attention walks key and value by the query's batch and their shared length (its backward
    writes gradients shaped like them), and its backward walks grad_out, out and logsumexp by the query's
    sizes, a row of head-size values per query position, looking at none of their shapes."""
    backward = name.endswith("_backward")
    if len(args) < 3 + 5 * backward:
        return ""
    q, k, v = args[backward:backward + 3]
    if not q.dim() == k.dim() == v.dim() == 4:  # eager's kernels refuse these themselves
        return ""
    if (k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0]
                                               or k.shape[3] != q.shape[3] or not k.shape[1] or q.shape[1] % k.shape[1]):
        return f"{name}: key or value does not fit the query (batch, heads, length or head size)"
    if not backward:  # an empty query or key length: the kernel divides by it
        return f"{name}: query or key of length 0" if 0 in (q.shape[2], k.shape[2]) else ""
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    try:
        want = meta_call(forward, [q, k, v, args[6], args[7]], {})
    except Exception:  # noqa: BLE001 - the forward refuses these: nothing says what the backward may read
        return f"{name}: the forward op refuses this query, key and value"
    if (args[0].shape, args[4].shape, args[5].shape) != (want[0].shape, want[0].shape, want[1].shape):
        return f"{name}: grad_out, out or logsumexp shaped unlike the forward op's results"
    return ""


# Backward kernels that pair grad_output's planes (all but the last k dimensions) with the input's, as (k, one
# per grad_output plane): 2-D adaptive pooling writes each grad_output plane's gradient into the input's plane
# of that number (more planes: written past the input's gradient); 3-D adaptive pooling and padding read a
# grad_output plane per input plane (fewer: read past, and max pooling's indices read there write anywhere).
_PLANE_PAIRS = {**dict.fromkeys(("adaptive_max_pool2d_backward", "_adaptive_avg_pool2d_backward"), (2, True)),
                **dict.fromkeys(("adaptive_max_pool3d_backward", "_adaptive_avg_pool3d_backward"), (3, False)),
                **{f"{kind}_pad{k}d_backward": (k, False) for kind in ("reflection", "replication") for k in (1, 2, 3)}}


# Weight norm's kernels: (position of v, position of dim).
_WEIGHT_NORM_V_DIM = {"_weight_norm_interface": (0, 2), "_weight_norm_interface_backward": (1, 4)}
# Pooling backward kernels that check every size of grad_output but its batch: (pooled dimensions).
_POOL_BATCH = {"avg_pool2d_backward": 2, "avg_pool3d_backward": 3, "max_pool3d_with_indices_backward": 3}


def _rnn_layer_unfit(name: str, args: list) -> str:
    """oneDNN's RNN layer builds only its LSTM (other modes are refused before it runs), sizes everything from
    its time-major input and hidden_size (four gates per hidden unit) and reads and writes the other tensors
    by those sizes."""
    backward = name.endswith("_backward")
    if len(args) < (23 if backward else 16):
        return ""
    x, mode, hidden = args[0], args[14 if backward else 9], args[15 if backward else 10]
    if mode != 2:
        return ""
    if x.dim() != 3:
        return f"{name}: input is not 3-D"
    t, b, f = x.shape
    gates = 4 * hidden
    shapes = [[gates, f], [gates, hidden]] + ([[gates], [gates]] if args[17 if backward else 12] else [None, None]) \
        + [[b, hidden]] * 2 + ([[t, b, hidden]] + [[b, hidden]] * 2) * 2 * backward
    for arg, want in zip(args[1:13], shapes):
        if want is not None and isinstance(arg, torch.Tensor) and list(arg.shape) != want:
            return f"{name}: a weight, state, output or gradient shaped unlike the input and hidden_size imply"
    if backward:  # the workspace's size is oneDNN's own: the forward's in training says how much it reads
        try:
            with torch.enable_grad():  # the forward keeps its workspace only with gradients on
                forward = torch.ops.aten.mkldnn_rnn_layer.default(*args[:7], args[13], args[20], mode, hidden,
                                                                  args[16], args[17], args[19], args[21], True)
        except RuntimeError:  # a dtype or size oneDNN refuses: the backward refuses it as well
            return ""
        if args[22].numel() < forward[3].numel():
            return f"{name}: the workspace is smaller than the forward op's"
    return ""


def _roi_unfit(op: Any, name: str, args: list) -> str:
    """torchvision's RoI kernels read (backward: write) the image column 0 of each box names, truncated to an
    int, and the backward ones read ``grad`` (and ``argmax``, ``channel_mapping``) as the forward output's
    shape, all unchecked (mncore refuses both)."""
    a = dict(zip([arg.name for arg in op._schema.arguments], args))
    rois = a.get("rois")
    batch = a.get("batch_size", a["input"].shape[0] if "input" in a else None)
    if rois is None or batch is None or rois.dim() != 2:
        return ""
    # a box is read as 5 values from the start of rois: the forward kernels refuse other widths, the backward
    # ones take any width (found: a SIGSEGV for 6 columns, whose image index of box n is value 5 * n)
    wide = rois.shape[1] > 5 and "grad" in a
    images = rois.reshape(-1)[:5 * rois.shape[0]:5].to(torch.int64) if rois.shape[1] == 5 or wide else None
    if images is not None and rois.numel() and (images.min() < 0 or images.max() >= batch):
        return f"{name}: a box names an image outside the batch of {batch}"
    if name in ("roi_align", "ps_roi_align") and rois.shape[0] and a["input"].dim() == 4 and 0 in a["input"].shape[2:]:
        return f"{name}: an image with no rows or columns (the kernel samples before its start)"
    if "grad" in a and a["grad"].numel() and rois.shape[0] and rois.shape[1] < 5:
        return f"{name}: rois has fewer than the 5 columns the kernel reads per box"
    if "grad" in a and a["grad"].numel() and {"channels", "pooled_height", "pooled_width"} <= a.keys():
        pooled = [a["pooled_height"], a["pooled_width"]]
        channels = a["channels"] // math.prod(pooled) if name.startswith("_ps_") and math.prod(pooled) else a["channels"]
        shape = [rois.shape[0], channels, *pooled]
        if any(list(a[k].shape) != shape for k in ("grad", "argmax", "channel_mapping") if k in a):
            return f"{name}: grad, argmax or channel_mapping is shaped unlike the forward output {shape}"
    return ""


def unsafe_for_eager(op: Any, args: list) -> str:
    """Why eager's kernel cannot run ``args`` safely ('' if it can); such a case has no eager reference."""
    name = op._schema.name.split("::")[-1].rstrip("_")
    shapes = [[t.shape for t in a] if isinstance(a, list) else None for a in args[:_PER_PARAMETER.get(name, 0)]]
    for i, given in enumerate(shapes[1:], 1):
        if given and given != shapes[0]:
            return f"{name}_: list {i} does not hold one tensor per parameter, shaped like it"
    if name == "_pdist_backward" and len(args) >= 4 and args[1].dim() == 2:
        n = args[1].shape[0] * (args[1].shape[0] - 1) // 2
        if min(args[0].numel(), args[3].numel()) < n:
            return f"_pdist_backward: the gradient or pdist holds fewer than the input's {n} pairs of rows"
    if name == "_cdist_backward" and len(args) >= 5 and min(args[1].dim(), args[2].dim()) >= 2:
        try:  # a distance per pair of rows in each broadcast batch, read from grad_output and cdist alike
            pairs = torch.Size(torch.broadcast_shapes(args[1].shape[:-2], args[2].shape[:-2])).numel() \
                * args[1].shape[-2] * args[2].shape[-2]
        except RuntimeError:
            pairs = 0
        if min(args[0].numel(), args[4].numel()) < pairs:
            return "_cdist_backward: grad_output or cdist holds fewer values than x1 and x2 have pairs of rows"
    if name == "native_layer_norm_backward" and len(args) >= 5 and torch.Size(args[2]).numel():
        rows = args[1].numel() // torch.Size(args[2]).numel()  # the input's rows of normalized_shape's size
        if args[0].numel() < args[1].numel() or min(args[3].numel(), args[4].numel()) < rows:
            return f"{name}: grad_out holds fewer values than the input, or mean or rstd fewer than its {rows} rows"
    if name == "gather" and len(args) >= 3 and args[2].dtype == torch.int32 and args[2].numel():
        index, size = args[2], args[0].shape[args[1]] if args[0].dim() else 1
        if (any(st == 0 and n > 1 for n, st in zip(index.shape, index.stride()))
                and (index.min() < 0 or index.max() >= size)):
            return ("gather: eager's fast path for an expanded int32 index skips the bounds check (int64 and dense "
                    "indices raise) and reads past the input")
    short = _short_channels(op, name, args) or _ctc_past_ends(name, args)
    if short:
        return short
    at = _EMBEDDING_ROWS.get(name)
    if at and len(args) > at[1] and args[at[0]].numel():
        rows = args[at[1]]
        if args[at[0]].min() < 0 or args[at[0]].max() >= rows:
            return f"{name}: an index is not a row of the {rows}-row gradient"
    if at and name != "embedding_dense_backward" and len(args) > at[1] + 2:
        # a bag per index (offset2bag is empty when the backward rebuilds it), and the mean's bag sizes
        grad, offset2bag, bag_size = args[0], args[at[1] - 3], args[at[1] - 2]
        bags = grad.shape[0] if grad.dim() else 1
        if offset2bag.numel() and (offset2bag.numel() < args[1].numel() or offset2bag.min() < 0
                                   or offset2bag.max() >= bags):
            return f"{name}: offset2bag names bags the {bags}-bag gradient does not have"
        if args[at[1] + 2] == 1 and bag_size.numel() < bags:
            return f"{name}: bag_size holds fewer values than the gradient has bags"
    at = _POOL_INDICES.get(name)
    if at and len(args) > at[0] and args[at[0]].numel():
        plane = args[1].shape[-at[1]:].numel()
        if args[at[0]].min() < 0 or args[at[0]].max() >= plane:
            return f"{name}: an index is outside the input's planes of {plane} positions"
    if name in _PLANE_PAIRS and len(args) >= 2:
        k, by_grad = _PLANE_PAIRS[name]
        if "adaptive" in name and 0 in args[1].shape[-k:]:
            return f"{name}: the input is empty in a pooled dimension (the kernel writes past its gradient)"
        given, planes = args[0].shape[:-k].numel(), args[1].shape[:-k].numel()
        if given > planes if by_grad else given < planes:
            return f"{name}: grad_output has {'more' if by_grad else 'fewer'} planes than the input"
    k = _POOL_BATCH.get(name)
    if k and len(args) >= 2 and args[0].dim() == args[1].dim() == k + 2 and args[0].shape[0] != args[1].shape[0]:
        return f"{name}: grad_output's batch differs from the input's (the kernel walks it by the input's)"
    if name == "max_pool3d_with_indices_backward" and len(args) >= 8 and args[7].numel() < args[0].numel():
        return f"{name}: indices holds fewer values than grad_output (read as one per gradient value)"
    if name == "fractional_max_pool3d_backward" and len(args) >= 5:
        planes = args[1].shape[:-3].numel() * torch.Size(args[3]).numel()  # the input's planes of output_size
        if min(args[0].numel(), args[4].numel()) < planes:
            return f"{name}: grad_output or indices holds fewer values than the input's planes of output_size"
    if name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
        return _attention_unfit(name, args)
    if name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
        return _rnn_layer_unfit(name, args)
    if op._schema.name.startswith("torchvision::") and "roi" in name:
        return _roi_unfit(op, name, args)
    if name in ("_embedding_bag", "_embedding_bag_forward_only") and len(args) > 2 and not (
            args[1].is_contiguous() and args[2].is_contiguous()):
        return (f"{name}: eager reads strided indices or offsets as if they were contiguous: other elements, up to "
                "past their end")
    at = _WEIGHT_NORM_V_DIM.get(name)
    if at and len(args) > at[1] and -args[at[0]].dim() <= args[at[1]] < args[at[0]].dim() \
            and not args[at[0]].shape[args[at[1]]]:
        return f"{name}: v has no slices along dim (the kernel divides by their number)"
    if name == "_weight_norm_interface" and len(args) >= 3 and -args[0].dim() <= args[2] < args[0].dim():
        g = args[1]  # the kernel writes one norm per slice of v into a new tensor laid out like g
        room = 1 + sum((n - 1) * st for n, st in zip(g.shape, g.stride())) if g.numel() else 0
        if room < args[0].shape[args[2]]:
            return "_weight_norm_interface: g has room for fewer norms than v has slices along dim"
    if name == "_weight_norm_interface_backward" and len(args) >= 5 and args[1].dim():
        v, dim = args[1], args[4]
        if args[0].numel() < v.numel() or min(args[2].numel(), args[3].numel()) < v.shape[dim]:
            return "_weight_norm_interface_backward: grad_w, saved_g or saved_norms is smaller than v implies"
    return ""


# CPU kernels that return the mean or sum of an empty batch without writing it (uninitialised memory)
_UNWRITTEN_EMPTY_LOSS = {"multi_margin_loss", "multilabel_margin_loss_forward"}


def left_unset(op: Any, args: list, gradient: bool = False) -> str:
    """Why eager's result (or its ``gradient``) is partly uninitialised memory for ``args`` ('' if it is not):
    ``_grouped_mm`` writes only what its groups cover (mncore writes zeros, the sum over nothing there): the
    rows (2-D by 3-D) or columns (3-D by 2-D) past the last offset, and, 2-D by 2-D, the groups whose share of
    the inner dimension is empty. Its backward is made of ``_grouped_mm`` calls of the other two kinds, so the
    gradient has both gaps whatever the kind."""
    if op._schema.name.split("::")[-1] != "_grouped_mm" or len(args) < 3 or not isinstance(args[2], torch.Tensor):
        return ""
    a, b, offs = args[:3]
    grouped = {(2, 3): a.shape[0], (3, 2): b.shape[-1], (2, 2): a.shape[-1]}.get((a.dim(), b.dim()))
    if grouped is None:
        return ""
    ends = offs.tolist()
    end = ends[-1] if ends else 0
    empty = sum(stop <= start for start, stop in zip([0, *ends], ends))
    if end < grouped and (gradient or (a.dim(), b.dim()) != (2, 2)):
        return f"eager leaves the {grouped - end} of {grouped} grouped rows no group covers unset"
    if empty and (gradient or (a.dim(), b.dim()) == (2, 2)):
        return f"eager leaves what the {empty} empty group(s) would compute unset"
    return ""


def reference_doubt(case: Case, op: Any, args: list, kwargs: dict, want: Any) -> str:
    """Why eager's answer cannot serve as the reference for this case ('' if it can).

    Eager CPU kernels do not validate every argument combination the fuzzer makes (a lone
    mismatched dim on a backward op, ``input_dtype`` disagreeing with the tensors): they return
    garbage, possibly read out of bounds, and PyTorch's meta kernels then disagree with them.
    Such cases say nothing about mncore vs eager, so those verdicts are skipped (and counted): eager
    CPU results that change when every input sits in fresh storage fenced with NaN/sentinel values
    (the kernel reads outside its inputs, or is nondeterministic: then no oracle applies, since
    mncore runs the same kernel), and meta kernels that give other shapes or dtypes than eager CPU
    or, for cases with a single-tensor shape or dtype mutation, reject the inputs eager CPU accepted
    (Context vs lazy, both mncore, is still checked then).
    """
    if unset := left_unset(op, args):
        return unset
    name = op._schema.name.split("::")[-1]
    if name == "_weight_norm_interface_backward" and len(args) >= 5 and args[1].dim() \
            and -args[1].dim() <= args[4] < args[1].dim() and args[2].numel() > args[1].shape[args[4]]:
        return "eager CPU writes grad_g for one saved_g value per slice of v and leaves the others unset"
    if name in _UNWRITTEN_EMPTY_LOSS and args[0].numel() == 0:
        schema = op._schema.arguments
        given = {**{a.name: a.default_value for a in schema if a.has_default_value()},
                 **dict(zip((a.name for a in schema), args)), **kwargs}
        if given["reduction"] != 0:
            return "eager CPU leaves the reduced loss of an empty batch unwritten (mncore: NaN mean, 0 sum)"
    if not is_random(op):
        again = op(*_fenced(args), **_fenced(kwargs))  # fresh storage already: no clone (it would drop the fence)
        if not compare(again, want):
            return UNDEFINED + " (its result changes with what surrounds them)"
    try:
        meta = meta_call(op, args, kwargs)
    except NotImplementedError:  # no meta kernel, or a data-dependent output shape (nonzero): no verdict
        return ""
    except Exception as e:  # noqa: BLE001
        if type(e).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException"):
            return ""
        if any(m["kind"] in ("resize", "dtype") and "arg" in m for m in case.mutations):
            return f"the meta kernel rejects inputs eager CPU accepts ({type(e).__name__})"
        return ""
    if not _same_meta(meta, want):
        return "eager CPU and the meta kernel disagree on output shapes/dtypes"
    return ""


def _contiguous(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.contiguous()
    if isinstance(x, list):
        return [_contiguous(a) for a in x]
    if isinstance(x, dict):
        return {k: _contiguous(v) for k, v in x.items()}
    return x


def layout_sensitive(op_name: str, op: Any, args: list, kwargs: dict, got: Any, got_args: list,
                     got_kwargs: dict) -> bool:
    """True if eager itself answers differently on contiguous copies of the inputs and mncore matches that.

    A device may run a kernel on a different layout (a copy of a non-dense input is dense). Where
    eager's own result depends on the layout (NaN patterns of blocked kernels, for instance), the
    contiguous answer is as valid a reference as the strided one.
    """
    if _all_contiguous(args, kwargs):
        return False
    try:
        want, want_args, want_kwargs = eager_call(op, _contiguous(args), _contiguous(kwargs))
    except Exception:  # noqa: BLE001
        return False
    return bool(judge(op_name, got, want, got_args, got_kwargs, want_args, want_kwargs))


def grads_layout_sensitive(op: Any, args: list, kwargs: dict, got: list, weight_seed: int) -> bool:
    """``layout_sensitive`` for the gradient oracle: eager's own gradients change when the inputs are made
    contiguous (``_ctc_loss`` with strided targets), and mncore's equal those of the contiguous copies."""
    if _all_contiguous(args, kwargs):
        return False
    try:
        want = grads(op, _contiguous(args), _contiguous(kwargs), "cpu", weight_seed)
    except Exception:  # noqa: BLE001
        return False
    return bool(compare(got, want, path="grad"))


def _all_contiguous(args: list, kwargs: dict) -> bool:
    tensors = [t for t in flatten([args, list(kwargs.values())]).values() if isinstance(t, torch.Tensor)]
    return all(t.is_contiguous() for t in tensors)


# -- the whole check of one case ------------------------------------------------------------------
def board_grads(op: Any, args: list, kwargs: dict, weight_seed: int, fmt: dict) -> list[torch.Tensor | None]:
    """The gradients in float64 with the operands and the outputs' weights as the board reads them: the
    weights are the backward matmuls' operands, cast to the outputs' 16-bit dtype first as in the lazy run."""
    low = next((t.dtype for t in flatten(args).values() if isinstance(t, torch.Tensor) and t.is_floating_point()),
               torch.float32)
    return board_reference(lambda a, k: grads(op, a, k, "cpu", weight_seed, lambda w: round_to(w.to(low), fmt)),
                           args, kwargs, fmt)


def _error(e: BaseException) -> str:
    lines = traceback.format_exception_only(type(e), e)
    return "".join(lines).strip()[-2000:]


def run_alone(case: Case, gradient: bool, phase: Callable[[str], None] = lambda name: None) -> dict:
    """``case`` on mncore only (its ``gradient``: the gradients ``grad_vs_eager`` takes), after eager's kernel
    killed its worker there: no reference to judge by, so raising or returning are both skips; what matters
    is that the worker lives (a crash here is the caller's finding)."""
    op = resolve_op(case.op)
    args, kwargs = case.build_inputs()
    oracle = "grad_alone" if gradient else "lazy_alone"
    phase(oracle)
    t0 = time.perf_counter()
    try:
        if gradient:
            grads(op, args, kwargs, "mncore", case.value_seed)
        else:
            lazy_call(op, args, kwargs)
        outcome = "mncore returned a result"
    except Exception as e:  # noqa: BLE001 - a clear error is what mncore should give here
        outcome = f"mncore raised {_error(e)}"
    return {"status": "skip", "category": "valid", "checks": {oracle: "pass"},
            "timings": {"lazy": time.perf_counter() - t0}, "message": outcome}


def run_case(case: Case, context: Any, codegen_dir: str, phase: Callable[[str], None] = lambda name: None) -> dict:
    """Run every applicable oracle on ``case``; returns a JSON-able outcome.

    ``status``: pass | fail | skip (no usable reference, or nothing to check) | refused (a documented
    mncore refusal); ``category``: valid | nonfinite | invalid; on failure ``kind`` (mismatch,
    nonfinite_mismatch, error, accepts_invalid) and ``oracle``; ``checks`` has one verdict per oracle
    (pass, unstable, fail, or ``n/a: reason``); ``timings`` in seconds.
    """
    res: dict[str, Any] = {"status": "pass", "category": case.category(), "checks": {}, "timings": {}}
    checks, timings = res["checks"], res["timings"]

    def fail(kind: str, oracle: str, message: str) -> dict:
        if kind == "mismatch" and res["category"] == "nonfinite":
            kind = "nonfinite_mismatch"
        res.update(status="fail", kind=kind, oracle=oracle, message=message)
        checks[oracle] = "fail"
        return res

    try:
        op = resolve_op(case.op)
        args, kwargs = case.build_inputs()
    except Exception as e:  # noqa: BLE001 - the generator could not realise this case
        return dict(res, status="skip", message=f"input generation: {_error(e)}")

    unsafe = unsafe_for_eager(op, args)
    if unsafe:
        return dict(res, status="skip",
                    message=f"reference undefined: {unsafe} (eager's kernel reads or writes past it)")
    phase("eager")
    t0 = time.perf_counter()
    try:
        want, want_args, want_kwargs = eager_call(op, args, kwargs)
        eager_error = None
    except Exception as e:  # noqa: BLE001 - eager rejects the inputs: an invalid-input case
        eager_error = e
    doubt = reference_doubt(case, op, args, kwargs, want) if eager_error is None else ""
    timings["eager"] = time.perf_counter() - t0
    if doubt.startswith(UNDEFINED):  # mncore runs the same kernel: no oracle can judge garbage
        return dict(res, status="skip", message=f"reference inconsistent: {doubt}")

    phase("lazy_vs_eager")
    t0 = time.perf_counter()
    if eager_error is not None:
        res["category"] = "invalid"
        res["eager_error"] = _error(eager_error)
        try:
            lazy_call(op, args, kwargs)
        except Exception as e:  # noqa: BLE001 - expected: mncore rejects what eager rejects
            checks["lazy_vs_eager"] = "pass"
            res["mncore_error"] = _error(e)
            timings["lazy"] = time.perf_counter() - t0
            return res
        return fail("accepts_invalid", "lazy_vs_eager",
                    f"eager raises {_error(eager_error)} but mncore returned a result")
    try:
        got, got_args, got_kwargs = lazy_call(op, args, kwargs)
    except NotImplementedError as e:
        if not str(e).startswith("mncore:"):
            return fail("error", "lazy_vs_eager", f"mncore raised where eager did not: {_error(e)}")
        # A documented refusal (README "Refused with a clear error"), e.g. in-place metadata changes.
        return dict(res, status="refused", message=_error(e))
    except Exception as e:  # noqa: BLE001
        if doubt:
            return dict(res, status="skip", message=f"reference inconsistent: {doubt}")
        return fail("error", "lazy_vs_eager", f"mncore raised where eager did not: {_error(e)}")
    timings["lazy"] = time.perf_counter() - t0
    if doubt:  # eager is no reference here, but Context vs lazy still is a check
        checks["lazy_vs_eager"] = "n/a: reference inconsistent"
        res["message"] = f"reference inconsistent: {doubt}"
    else:
        verdict = judge(case.op, got, want, got_args, got_kwargs, want_args, want_kwargs)
        if verdict:
            checks["lazy_vs_eager"] = "pass"
        else:
            def float64_run() -> Any:
                return _unstable_pairs(case.op, op(*to_double(clone(args)), **to_double(clone(kwargs))), want)[0]

            fmt = operand_format(op, args, kwargs)

            def board_run() -> Any:
                return _unstable_pairs(case.op, board_reference(lambda a, k: op(*a, **k), clone(args), clone(kwargs),
                                                                fmt), want)[0]

            values = verdict.message.startswith("out")
            if values and is_noise(*_unstable_pairs(case.op, got, want), float64_run):
                checks["lazy_vs_eager"] = "unstable"
            elif values and fmt and is_noise(*_unstable_pairs(case.op, got, want), board_run):
                checks["lazy_vs_eager"] = "board-format"
            elif layout_sensitive(case.op, op, args, kwargs, got, got_args, got_kwargs):
                checks["lazy_vs_eager"] = "layout-sensitive"
            else:
                return fail("mismatch", "lazy_vs_eager", verdict.message)

    phase("context_vs_lazy")
    t0 = time.perf_counter()
    try:
        from_context, proxies = context_call(op, args, kwargs, context, codegen_dir)
        lazy = result_dict(op, got, got_args, got_kwargs)
        for k, (shape, dtype) in proxies.items():
            value = from_context[k]
            if (list(value.shape), value.dtype) != (shape, dtype):
                return fail("mismatch", "context_vs_lazy", f"{k}: the TensorProxy reports {shape} {dtype} but .cpu() "
                                                           f"returns {list(value.shape)} {value.dtype}")
        v = judge_dicts(case.op, from_context, lazy)
        if not v:
            return fail("mismatch", "context_vs_lazy", v.message)
        checks["context_vs_lazy"] = "pass"
    except NotApplicable as e:
        checks["context_vs_lazy"] = f"n/a: {e}"
    except Exception as e:  # noqa: BLE001
        if "cannot read tensor values on the host" in str(e):  # by design: data-dependent shapes
            checks["context_vs_lazy"] = "n/a: data-dependent op (compile-once API)"
        elif isinstance(e, NotCompilableError) and "output shape is not known before it runs" in str(e):
            # by design: an op lazy mode runs eagerly (no shape function, or one that needs the values)
            checks["context_vs_lazy"] = "n/a: output shape known only by running the op (compile-once API)"
        else:
            return fail("error", "context_vs_lazy", f"Context API raised where lazy mode did not: {_error(e)}")
    timings["context"] = time.perf_counter() - t0

    phase("captured_vs_lazy")
    t0 = time.perf_counter()
    try:
        cap, cap_args, cap_kwargs = captured_call(op, args, kwargs, case.value_seed)
        v = judge(case.op, cap, got, cap_args, cap_kwargs, got_args, got_kwargs)
        if not v:
            return fail("mismatch", "captured_vs_lazy", v.message)
        checks["captured_vs_lazy"] = "pass"
    except NotApplicable as e:
        checks["captured_vs_lazy"] = f"n/a: {e}"
    except Exception as e:  # noqa: BLE001
        return fail("error", "captured_vs_lazy", f"the captured step raised where lazy mode did not: {_error(e)}")
    timings["captured"] = time.perf_counter() - t0

    phase("eager_grad")  # a crash or hang here is eager's own (e.g. CPU's pdist backward of no rows)
    t0 = time.perf_counter()
    try:
        if doubt:
            raise NotApplicable("reference inconsistent")
        if is_random(op) or written(op):
            raise NotApplicable("random or in-place op")
        if unset := left_unset(op, args, gradient=True):
            raise NotApplicable(unset)
        want_g = grads(op, args, kwargs, "cpu", case.value_seed)
    except NotApplicable as e:
        checks["grad_vs_eager"] = f"n/a: {e}"
        want_g = None
    except Exception as e:  # noqa: BLE001 - eager has no derivative for this op/dtype
        checks["grad_vs_eager"] = f"n/a: eager backward raises {type(e).__name__}"
        want_g = None
    if want_g is not None:
        phase("grad_vs_eager")
        try:
            got_g = grads(op, args, kwargs, "mncore", case.value_seed)
        except Exception as e:  # noqa: BLE001
            return fail("error", "grad_vs_eager", f"mncore backward raised where eager did not: {_error(e)}")
        timings["grad"] = time.perf_counter() - t0
        v = compare(got_g, want_g, path="grad")
        if v:
            checks["grad_vs_eager"] = "pass"
        elif is_noise(got_g, want_g, lambda: grads(op, to_double(args), to_double(kwargs), "cpu", case.value_seed)):
            checks["grad_vs_eager"] = "unstable"
        elif (fmt := operand_format(op, args, kwargs)) and is_noise(
                got_g, want_g, lambda: board_grads(op, args, kwargs, case.value_seed, fmt)):
            checks["grad_vs_eager"] = "board-format"
        elif grads_layout_sensitive(op, args, kwargs, got_g, case.value_seed):
            checks["grad_vs_eager"] = "layout-sensitive"
        else:
            return fail("mismatch", "grad_vs_eager", v.message)
    if doubt:
        res["status"] = "skip"
    return res
