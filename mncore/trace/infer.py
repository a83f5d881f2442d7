"""Shape inference on meta tensors, cached per op signature (op, non-tensor arguments, input metadata)."""
from __future__ import annotations

import math
from time import perf_counter
from typing import Any

import torch

from mncore.compile.lowering import BATCH_NORM_BACKWARD_OF_NOTHING
from mncore.errors import layout_error
from mncore.ir.meta import meta_of
from mncore.ir.ops import named_args
from mncore.ir.targets import MutateFn
from mncore.ir.values import DEV, OpSig, ScalarMarker, T
from mncore.observe import metrics
from mncore.trace.sites import user_site
from mncore.trace.state import tracer


def _materialize(x: Any, it: Any, sit: Any) -> Any:
    if x is T:
        next(it)
        shape, stride, dtype = next(sit)
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    tp = type(x)
    if tp is ScalarMarker:
        return next(it).value
    if tp is tuple:
        return [_materialize(y, it, sit) for y in x]
    if x is DEV:
        return torch.device("meta")
    return x


def _check_grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Any) -> None:
    """What eager's CPU kernel refuses, refused at the op rather than when the graph runs."""
    def fail(why: str) -> None:
        raise RuntimeError(f"_grouped_mm: {why}")

    if mat_a.dtype not in (torch.float32, torch.bfloat16, torch.float16) or mat_b.dtype != mat_a.dtype:
        fail(f"operands must both be float32, bfloat16 or float16, got {mat_a.dtype} and {mat_b.dtype}")
    if mat_a.dim() not in (2, 3) or mat_b.dim() not in (2, 3):
        fail(f"operands must be 2-d or 3-d, got {mat_a.dim()}-d and {mat_b.dim()}-d")
    if (mat_a.dim() == 3 or mat_b.dim() == 3) and mat_a.size(-1) != mat_b.size(-2):
        fail(f"contraction dimensions differ: {mat_a.size(-1)} and {mat_b.size(-2)}")
    if (mat_a.dim() == 2 or mat_b.dim() == 2) and offs is None:
        fail("a 2-d operand needs offs (the end of each group)")
    align = 16 // mat_a.element_size()
    for name, m in (("mat_a", mat_a), ("mat_b", mat_b)):
        (rows, cols), (rs, cs) = m.shape[-2:], m.stride()[-2:]
        lead = cs if rs == 1 and cs >= max(1, rows) else rs if cs == 1 and rs >= max(1, cols) else None
        if lead is None or lead % align:
            fail(f"{name} (shape {list(m.shape)}, strides {list(m.stride())}) must be row- or column-major with "
                 f"rows 16-byte aligned ({align} {m.dtype} elements); make its last dimension a multiple of {align}")


def _grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Any = None, bias: Any = None,
                out_dtype: Any = None) -> torch.Tensor:
    """``_grouped_mm``'s output as eager's kernels shape it. PyTorch's meta rule checks CUDA's operand
    rules (bfloat16 or float16 only), so float32 MoE layers, which the CPU runs, had no output shape. The
    last dimension is padded to 16 bytes in the strides, as ``create_grouped_gemm_output_tensor`` does."""
    _check_grouped_mm(mat_a, mat_b, offs)
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif a2:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif b2:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    dtype = out_dtype or mat_a.dtype
    align = max(16 // dtype.itemsize, 1)
    padded = -(-size[-1] // align) * align
    stride = [padded, 1] if len(size) == 2 else [size[1] * padded, padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device="meta")


def _histc(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``histc`` counts integers on mncore, as CUDA's kernel does (``compile.lowering``), but no PyTorch
    kernel takes bool and its meta rule does: a bool input runs eagerly, which raises eager's error."""
    if x.dtype == torch.bool:
        raise NotImplementedError("histc has no kernel for bool tensors")
    return torch.ops.aten.histc.default(x, *args, **kwargs)


# Fused optimizer steps: how many of their leading lists hold one tensor per parameter, shaped like it.
_PER_PARAMETER_LISTS = {"_fused_adam": 5, "_fused_adamw": 5, "_fused_sgd": 3, "_fused_adagrad": 3}


def _fused_step(*args: Any, **kwargs: Any) -> None:
    """A fused optimizer step on meta tensors: it writes its lists in place and returns nothing (PyTorch's
    rule for ``_fused_adam_``). PyTorch has that rule for Adam and AdamW with a float ``lr`` only, so
    ``SGD(fused=True)``, ``Adagrad(fused=True)`` and a tensor ``lr`` ran eagerly, cutting the graph at every
    optimizer step (and step capture refused such a step)."""


# Ops whose meta rule does not describe what the CPU computes: the rule here does.
_OWN_SHAPE_RULES = {"_grouped_mm.default": _grouped_mm, "histc.default": _histc,
                    **{op.__name__: rule for op, rule in BATCH_NORM_BACKWARD_OF_NOTHING.items()},
                    **{f"{name}_.{overload}": _fused_step for name in _PER_PARAMETER_LISTS
                       for overload in ("default", "tensor_lr")}}


def _eval_batch_norm(args: list, kwargs: dict, out: tuple) -> tuple:
    """Batch norm in eval mode saves no statistics: eager returns them empty ([0]), its meta kernel [C]."""
    training = kwargs.get("training", args[5] if len(args) > 5 else False)
    if training is not False:
        return out
    return (out[0], out[1].new_empty((0,)), out[2].new_empty((0,)), *out[3:])


def _unreduced_1d_multilabel_loss(args: list, kwargs: dict, out: tuple) -> tuple:
    """``multilabel_margin_loss_forward`` of a 1-d input without reduction: eager's loss is 0-d, meta's [1]."""
    reduction = kwargs.get("reduction", args[2] if len(args) > 2 else 1)
    return (out[0].reshape(()), *out[1:]) if args[0].dim() == 1 and reduction == 0 else out


def _embedding_bag(args: list, kwargs: dict, out: tuple) -> tuple:
    """``_embedding_bag``'s bookkeeping outputs as the CPU kernel shapes them (meta's differ): a bag count
    less the closing offset with ``include_last_offset``, ``max_indices`` of one entry per bag outside
    ``max`` mode, and no ``offset2bag`` on the kernel's fast sum path (float32/16 or bfloat16 rows, unit
    strides, no padding index)."""
    a = named_args(torch.ops.aten._embedding_bag.default, args, kwargs)
    weight, scale = a["weight"], a["per_sample_weights"]
    bags = a["offsets"].size(0) - (1 if a["include_last_offset"] else 0)
    fast_sum = (a["mode"] == 0 and a["padding_idx"] < 0 and weight.stride(1) == 1
                and weight.dtype in (torch.float32, torch.float16, torch.bfloat16)
                and (scale is None or scale.stride(0) == 1))
    offset2bag = out[1].new_empty((0,)) if fast_sum else out[1]
    max_indices = out[3] if a["mode"] == 2 else out[2].new_empty((bags,))
    return out[0], offset2bag, out[2].new_empty((bags,)), max_indices


# Ops whose meta kernel gives outputs another shape than eager's kernels: the rule makes them agree.
_CPU_SHAPES = {
    "native_batch_norm.default": _eval_batch_norm,
    "_native_batch_norm_legit.default": _eval_batch_norm,
    "_native_batch_norm_legit_no_training.default": lambda args, kwargs, out: _eval_batch_norm(
        [*args[:5], False], {}, out),
    "multilabel_margin_loss_forward.default": _unreduced_1d_multilabel_loss,
    "_embedding_bag.default": _embedding_bag,
}


def _cpu_shapes(target: Any, margs: list, mkw: dict, out: Any) -> Any:
    op = target.op if isinstance(target, MutateFn) else target  # ops writing their arguments are wrapped
    rule = _CPU_SHAPES.get(getattr(op, "__name__", ""))
    return rule(margs, mkw, out) if rule is not None and isinstance(out, tuple) else out



def _unsafe_sizes(target: Any, args: list, kwargs: dict) -> str:
    """Why ``target``'s CPU kernel cannot run ``args`` safely ('' when it can): some CPU kernels trust their
    arguments' sizes and read or write past a smaller tensor until the process dies, eager's too (found by
    fuzzing). mncore refuses such a call at the op."""
    op = target.op if isinstance(target, MutateFn) else target
    name = getattr(op, "__name__", "")
    return (_unmatched_list(op, name, args, kwargs) or _short_argument(name, args) or _channels(op, name, args, kwargs)
            or _attention(name, args, kwargs) or _rnn_layer(name, args) or _roi_gradient(op, name, args, kwargs)
            or _roi_empty_image(op, name, args, kwargs))


_ROI_BACKWARD = {"_roi_align_backward.default", "_roi_pool_backward.default", "_ps_roi_align_backward.default",
                 "_ps_roi_pool_backward.default"}


def _roi_empty_image(op: Any, name: str, args: list, kwargs: dict) -> str:
    """torchvision's RoI align kernels (plain and position-sensitive) sample each box's bins from the image by
    bilinear interpolation, clamping to its last row and column: an image with no rows or columns is read before
    its start (found by fuzzing: SIGSEGV, eager's too). Pooling kernels skip empty bins."""
    if name not in ("roi_align.default", "ps_roi_align.default"):
        return ""
    a = named_args(op, args, kwargs)
    x, rois = a["input"], a["rois"]
    if x.dim() == 4 and 0 in x.shape[2:] and rois.dim() == 2 and rois.shape[0]:
        return (f"mncore: {name.split('.')[0]}: the input {list(x.shape)} has images with no rows or columns, and "
                "the kernel samples each box from the image (it would read before its start); leave the op out "
                "for empty images")
    return ""


def _roi_gradient(op: Any, name: str, args: list, kwargs: dict) -> str:
    """torchvision's RoI backward kernels walk ``grad`` by its number of elements, as (box, channel, row, column)
    of the sizes their arguments give, through its strides: one of another shape is read past (and so are the
    boxes); ``argmax`` and ``channel_mapping`` are read alike. Each must have the forward output's shape."""
    if name not in _ROI_BACKWARD:
        return ""
    a = named_args(op, args, kwargs)
    if not a["grad"].numel():
        return ""  # the kernels return the zero gradient at once
    rois, pooled = a["rois"], [a["pooled_height"], a["pooled_width"]]
    if rois.dim() == 2 and rois.shape[0] and rois.shape[1] < 5:  # read at 5 a row (found: SIGSEGV)
        return (f"mncore: {name.split('.')[0]}: rois has shape {list(rois.shape)}, but the kernel reads 5 values per "
                "box (image index, x1, y1, x2, y2); pass the boxes the forward op took")
    channels = a["channels"] // math.prod(pooled) if name.startswith("_ps_") and math.prod(pooled) else a["channels"]
    shape = [rois.shape[0], channels, *pooled]
    for arg in ("grad", "argmax", "channel_mapping"):
        if arg in a and list(a[arg].shape) != shape:
            return (f"mncore: {name.split('.')[0]}: {arg} has shape {list(a[arg].shape)}, but {rois.shape[0]} boxes, "
                    f"{a['channels']} channels and pooled size {pooled} make the forward output {shape}; the kernel "
                    "reads it by that shape")
    return ""


_LSTM = 2  # oneDNN's RNN layer mode (0, 1: RNN with ReLU or tanh; 3: GRU)


def _rnn_layer(name: str, args: list) -> str:
    """oneDNN's RNN layer kernels size everything from the time-major input and ``hidden_size`` and trust the
    weights, states, outputs and gradients to match (found by fuzzing: a backward given an ``hx`` of one
    column for 64 corrupted the heap, eager's too). Each must have the shape the layer gives it."""
    backward = name == "mkldnn_rnn_layer_backward.default"
    if not (backward and len(args) >= 23 or name == "mkldnn_rnn_layer.default" and len(args) >= 16):
        return ""
    x = args[0]
    mode, hidden, has_biases = (args[14], args[15], args[17]) if backward else (args[9], args[10], args[12])
    if mode != _LSTM:
        return ""  # oneDNN builds only its LSTM here and refuses the other modes before it runs
    if x.dim() != 3:
        return f"mncore: {name.split('.')[0]}: input must be 3-D (time, batch, features), got {list(x.shape)}"
    steps, batch, features = x.shape
    rows = 4 * hidden  # an LSTM's four gates
    state = [batch, hidden]
    want = [("input weight", args[1], [rows, features]), ("hidden weight", args[2], [rows, hidden]),
            ("hx", args[5], state), ("cx", args[6], state)]
    if has_biases:
        want += [("input bias", args[3], [rows]), ("hidden bias", args[4], [rows])]
    if backward:
        want += [("output", args[7], [steps, batch, hidden]), ("hy", args[8], state), ("cy", args[9], state),
                 ("grad_output", args[10], [steps, batch, hidden]), ("grad_hy", args[11], state),
                 ("grad_cy", args[12], state)]
    for arg, t, shape in want:
        if t is not None and list(t.shape) != shape:
            return (f"mncore: {name.split('.')[0]}: {arg} has shape {list(t.shape)}, but an input of shape "
                    f"{list(x.shape)} and hidden_size {hidden} need {shape}; the kernel reads and writes it by that "
                    "shape")
    if backward:  # the workspace's size is oneDNN's own: a training forward on zeros of these shapes gives it
        zeros = [torch.zeros(t.shape, dtype=t.dtype) for t in args[:7]]
        try:
            with torch.enable_grad():  # without it (autograd's backward, no_grad) the forward keeps no workspace
                need = torch.ops.aten.mkldnn_rnn_layer.default(*zeros, args[13], args[20], mode, hidden, args[16],
                                                               has_biases, args[19], args[21], True)[3].numel()
        except RuntimeError:
            return ""  # a dtype or size oneDNN refuses: the backward kernel refuses it too
        if args[22].numel() < need:
            return (f"mncore: mkldnn_rnn_layer_backward: workspace holds {args[22].numel()} values, but oneDNN "
                    f"needs {need} for these shapes; pass the workspace the forward op returned in training")
    return ""


_ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu.default",
              "_scaled_dot_product_flash_attention_for_cpu_backward.default"}


def _attention(name: str, args: list, kwargs: dict) -> str:
    """CPU's flash attention walks key and value by the query's batch and their shared length, and its
    backward writes gradients shaped like them; a smaller one is read, and in backward written, past its end
    (found by fuzzing: a value with one batch of two corrupted the heap). Its backward also reads
    ``grad_out``, ``out`` and ``logsumexp`` by the query's sizes, one row of head-size values per query
    position: each must have the shape the forward op gives. The forward divides its work by the query's and
    key's lengths: neither may be 0."""
    if name not in _ATTENTION:
        return ""
    backward = name.startswith("_scaled_dot_product_flash_attention_for_cpu_backward")
    query, key, value = args[backward:backward + 3]
    op = name.split(".")[0]
    if not query.dim() == key.dim() == value.dim() == 4:  # eager's kernels refuse these too, not its meta
        return (f"mncore: {op}: accepts only 4-D query, key and value (batch, heads, length, head size), got "
                f"{query.dim()}-D, {key.dim()}-D and {value.dim()}-D")
    if (key.shape[:3] != value.shape[:3] or key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3]
            or key.shape[1] == 0 or query.shape[1] % key.shape[1]):
        return (f"mncore: {op}: query {list(query.shape)}, key {list(key.shape)} and value {list(value.shape)} do "
                "not fit: key and value need the same batch, heads and length, key the query's batch and head "
                "size, and the query's heads must be a multiple of key's; the CPU kernel would read past the "
                "smaller tensor")
    if not backward and 0 in (query.shape[2], key.shape[2]):  # found by fuzzing: SIGFPE, eager's too
        return (f"mncore: {op}: query {list(query.shape)} or key {list(key.shape)} has length 0, and the CPU kernel "
                "divides its work by the lengths (eager PyTorch's dies of it); leave the op out for empty sequences")
    if not backward or len(args) < 8:
        return ""
    grad_out, out, logsumexp, dropout_p, is_causal = args[0], args[4], args[5], args[6], args[7]
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    want, want_lse = forward(*(t.to("meta") for t in (query, key, value)), dropout_p, is_causal,
                             attn_mask=None if kwargs.get("attn_mask") is None else kwargs["attn_mask"].to("meta"),
                             scale=kwargs.get("scale"))
    for arg, t, shape in (("grad_out", grad_out, want.shape), ("out", out, want.shape),
                          ("logsumexp", logsumexp, want_lse.shape)):
        if t.shape != shape:
            return (f"mncore: {op}: {arg} has shape {list(t.shape)}, but the forward op gives {list(shape)} for this "
                    f"query, key and value, and the kernel reads it by that shape; pass the forward op's "
                    f"{'output and its gradient' if arg != 'logsumexp' else 'logsumexp'}")
    return ""


def _unmatched_list(op: Any, name: str, args: list, kwargs: dict) -> str:
    """A fused optimizer step whose gradient or state lists do not match its parameters."""
    name = name.split(".")[0].rstrip("_")
    n = _PER_PARAMETER_LISTS.get(name)
    if n is None:
        return ""
    names = [a.name for a in op._schema.arguments]
    lists = [args[i] if i < len(args) else kwargs.get(names[i]) for i in range(n)]
    params = lists[0]
    for i in range(1, n):
        tensors = lists[i]
        if not tensors:  # an unused list (max_exp_avg_sqs without amsgrad, no momentum buffers yet)
            continue
        if len(tensors) != len(params):
            return (f"mncore: {name}_: {names[i]} holds {len(tensors)} tensors for {len(params)} parameters; "
                    "pass one per parameter")
        for j, (p, t) in enumerate(zip(params, tensors)):
            if t.shape != p.shape:
                return (f"mncore: {name}_: {names[i]}[{j}] has shape {list(t.shape)} but its parameter {names[0]}[{j}] "
                        f"has {list(p.shape)}; each list holds one tensor per parameter, shaped like it")
    return ""


# Backward ops whose CPU kernel pairs grad_output's planes (all but its last k dimensions) with the input's,
# trusting their counts, and how: 2-D adaptive pooling by grad_output's count, so more planes are written past
# the input's gradient; 3-D adaptive pooling and padding by the input's, so fewer are read past (and max
# pooling's garbage indices then write anywhere).
_PLANES_BY_GRAD = "writes each grad_output plane's gradient into the input's plane of the same number"
_PLANES_BY_INPUT = "reads a grad_output plane for each of the input's planes"
_PLANE_BACKWARD = {
    **dict.fromkeys(("adaptive_max_pool2d_backward", "_adaptive_avg_pool2d_backward"), (2, _PLANES_BY_GRAD)),
    **dict.fromkeys(("adaptive_max_pool3d_backward", "_adaptive_avg_pool3d_backward"), (3, _PLANES_BY_INPUT)),
    **{f"{kind}_pad{k}d_backward": (k, _PLANES_BY_INPUT) for kind in ("reflection", "replication") for k in (1, 2, 3)},
}


# Weight norm's kernels: the positions of v and dim.
_WEIGHT_NORM_V_DIM = {"_weight_norm_interface.default": (0, 2), "_weight_norm_interface_backward.default": (1, 4)}
# Pooling backward kernels that check grad_output's sizes except its batch (k pooled dimensions).
_POOL_BATCH = {"avg_pool2d_backward": 2, "avg_pool3d_backward": 3, "max_pool3d_with_indices_backward": 3}


def _short_argument(name: str, args: list) -> str:
    """An argument holding fewer values than the kernel reads from it (more are read as eager reads them), a
    saved g of weight norm's backward with more values than the gradient the kernel writes, a size the kernel
    divides by that is 0 (weight norm's slices), or a pooling gradient walked by sizes it does not have (another
    batch; an input empty in an adaptive pooling's pooled dimension)."""
    fix = "pass the tensors the forward op returned"
    at = _WEIGHT_NORM_V_DIM.get(name)
    if at and len(args) > at[1]:
        v, dim = args[at[0]], args[at[1]]
        if isinstance(dim, int) and v.dim() and -v.dim() <= dim < v.dim() and not v.shape[dim]:  # SIGFPE, eager's too
            return (f"mncore: {name.split('.')[0]}: v {list(v.shape)} has no slices along dim {dim}, and the CPU kernel "
                    "divides by their number (eager PyTorch's dies of it); a weight with no slices has nothing to "
                    "normalize")
    if name == "_weight_norm_interface.default" and len(args) >= 3:
        v, g, dim = args[:3]  # the kernel also writes one norm per slice into a tensor laid out like g
        reads = [("g", g.numel(), _slices(v, dim))]
        fix = "pass one g value per slice of v along dim"
    elif name == "_pdist_backward.default" and len(args) >= 4:
        grad, x, _, pdist = args[:4]
        rows = x.shape[0] if x.dim() == 2 else 0
        pairs = rows * (rows - 1) // 2  # one distance per pair of rows
        reads = [("grad", grad.numel(), pairs), ("pdist", pdist.numel(), pairs)]
    elif name == "_cdist_backward.default" and len(args) >= 5:
        grad, x1, x2, _, cdist = args[:5]
        try:  # one distance per pair of rows, in each of the broadcast batches
            pairs = math.prod(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])) * x1.shape[-2] * x2.shape[-2]
        except (RuntimeError, IndexError):
            return ""  # the kernel refuses these itself
        reads = [("grad_output", grad.numel(), pairs), ("cdist", cdist.numel(), pairs)]
    elif name == "_weight_norm_interface_backward.default" and len(args) >= 5:
        grad_w, v, g, norms, dim = args[:5]
        if g.numel() > _slices(v, dim):  # grad_g is laid out like saved_g: the values past the slices stay unset
            return (f"mncore: _weight_norm_interface_backward: saved_g holds {g.numel()} values, but v has "
                    f"{_slices(v, dim)} slices along dim {dim} and the kernel writes one gradient value per slice "
                    f"into a tensor shaped like saved_g, leaving the rest unset; {fix}")
        reads = [("grad_w", grad_w.numel(), v.numel()), ("saved_g", g.numel(), _slices(v, dim)),
                 ("saved_norms", norms.numel(), _slices(v, dim))]
    elif name == "native_layer_norm_backward.default" and len(args) >= 5:
        grad, x, normalized, mean, rstd = args[:5]  # read as the input's rows of normalized_shape's size
        size = math.prod(normalized)
        if x.dim() < len(normalized) or not size:
            return ""  # the kernel's own input checks refuse these, or nothing is read
        rows = x.numel() // size
        reads = [("grad_out", grad.numel(), x.numel()), ("mean", mean.numel(), rows), ("rstd", rstd.numel(), rows)]
        fix = "pass the gradient of the forward op's output and the mean and rstd it returned"
    elif name.split(".")[0] in _POOL_BATCH and len(args) >= 2:
        grad, x, k = args[0], args[1], _POOL_BATCH[name.split(".")[0]]
        if grad.dim() == x.dim() == k + 2 and grad.shape[0] != x.shape[0]:  # other sizes: the kernel checks them
            return (f"mncore: {name.split('.')[0]}: grad_output has a batch of {grad.shape[0]} but the input "
                    f"{x.shape[0]}, and the kernel walks the gradient by the input's (eager PyTorch's corrupts memory "
                    "with more); pass the gradient of the forward op's output")
        if not name.startswith("max_pool3d") or len(args) < 8:
            return ""
        reads = [("indices", args[7].numel(), grad.numel())]  # one per gradient value, unchecked (found: SIGSEGV)
        fix = "pass the indices the pooling op returned"
    elif name.split(".")[0] in _PLANE_BACKWARD and len(args) >= 2:
        k, pairing = _PLANE_BACKWARD[name.split(".")[0]]
        if name.startswith(("adaptive", "_adaptive")) and 0 in args[1].shape[-k:]:  # found by fuzzing: SIGSEGV
            return (f"mncore: {name.split('.')[0]}: the input {list(args[1].shape)} has size 0 in a pooled dimension, "
                    "which the forward op refuses, and the kernel would write past the empty gradient (eager "
                    "PyTorch's does); pass the forward op's input")
        given, planes = _planes(args[0], k), _planes(args[1], k)
        if given > planes if pairing is _PLANES_BY_GRAD else given < planes:
            return (f"mncore: {name.split('.')[0]}: grad_output has {given} planes but the input {planes}, and "
                    f"the kernel {pairing}; pass the gradient of the forward op's output")
        return ""
    elif name == "fractional_max_pool3d_backward.default" and len(args) >= 5:
        grad, x, _, output_size, indices = args[:5]  # read as the input's planes of output_size positions
        needed = _planes(x, 3) * math.prod(output_size)
        reads = [("grad_output", grad.numel(), needed), ("indices", indices.numel(), needed)]
        fix = "pass the gradient and indices of the pooling op's output"
    else:
        return ""
    for arg, has, needed in reads:
        if has < needed:
            return (f"mncore: {name.split('.')[0]}: {arg} holds {has} values, but the kernel reads {needed} for these "
                    f"inputs; {fix}")
    return ""


_BATCH_NORMS = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_no_update",
                "native_batch_norm_backward", "batch_norm_backward"}


def _channels(op: Any, name: str, args: list, kwargs: dict) -> str:
    """Batch norm's CPU kernels read one value per channel from each affine and statistics tensor, and in
    training write the running statistics, trusting their sizes (fewer values: read or written past their
    end, eager's too). PyTorch's ``batch_norm`` requires exactly one per channel; so does mncore here. The
    backward kernels also read ``grad_out`` as the input's values."""
    base = name.split(".")[0]
    if base not in _BATCH_NORMS:
        return ""
    a = named_args(op, args, kwargs)
    x = a.get("input")
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        return ""
    names = ["weight", "bias", "running_mean", "running_var"]
    if "backward" in base:  # training reads the saved statistics, evaluation the running ones
        names = ["weight"] + (["save_mean", "save_invstd", "save_var"] if a.get("train", a.get("update"))
                              else ["running_mean", "running_var"])
        grad = a.get("grad_out")
        if isinstance(grad, torch.Tensor) and grad.numel() < x.numel():  # read as the input's values (found: NaN)
            return (f"mncore: {base}: grad_out holds {grad.numel()} values, but the kernel reads one per value of the "
                    f"input, {x.numel()}; pass the gradient of the forward op's output")
    for arg in names:
        t = a.get(arg)
        if isinstance(t, torch.Tensor) and t.numel() != x.shape[1]:
            return (f"mncore: {base}: {arg} should contain {x.shape[1]} elements (one per channel of the input) "
                    f"not {t.numel()}")
    return ""


def _planes(t: torch.Tensor, dims: int) -> int:
    """How many planes of its last ``dims`` dimensions a pooling op's tensor holds."""
    return math.prod(t.shape[:-dims]) if t.dim() > dims else 1


def _slices(v: torch.Tensor, dim: int) -> int:
    """Weight norm's kernels keep one norm per slice of ``v`` along ``dim``."""
    return v.shape[dim] if v.dim() and -v.dim() <= dim < v.dim() else 1


class FallbackNeeded(Exception):
    """Meta inference cannot know the output shape (data-dependent op): run it eagerly."""


def _infer(target: Any, targs: tuple, tkw: tuple, inputs: list, sigs: list) -> tuple:
    it, sit = iter(inputs), iter(sigs)
    margs = [_materialize(a, it, sit) for a in targs]
    mkw = {k: _materialize(v, it, sit) for k, v in tkw}
    own = _OWN_SHAPE_RULES.get(getattr(target, "__name__", ""))
    unsafe = _unsafe_sizes(target, margs, mkw)
    if unsafe:
        raise RuntimeError(unsafe)
    if isinstance(target, MutateFn) and target.op.__name__ in _OWN_SHAPE_RULES:  # an in-place op: clone, run the rule
        own = target.with_op(_OWN_SHAPE_RULES[target.op.__name__])
    try:
        out = target(*margs, **mkw) if own is None else own(*margs, **mkw)
    except NotImplementedError as e:
        raise FallbackNeeded(str(e)) from e
    except (ZeroDivisionError, TypeError) as e:
        # a defect of a shape function written in Python, for inputs its kernel takes (an empty tensor:
        # mse_loss_backward divides by its numel, upsample_nearest1d checks an int as a bool): the op runs
        # eagerly instead, and eager decides
        raise FallbackNeeded(f"{getattr(target, '__name__', target)}'s shape function failed: "
                             f"{type(e).__name__}: {e}") from e
    except RuntimeError as e:
        msg = str(e)
        if ("data-dependent" in msg or "DataDependent" in msg or "meta tensors" in msg or "Meta" in msg
                or "meta tensor without" in msg):  # repeat_interleave without output_size
            raise FallbackNeeded(msg) from e
        raise
    out = _cpu_shapes(target, margs, mkw, out)
    for o in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(o, torch.Tensor) and o.layout != torch.strided:
            raise layout_error(o.layout, f"the result of {getattr(target, '__name__', target)}")
    if isinstance(out, torch.Tensor):
        return None, (meta_of(out),)
    if isinstance(out, (tuple, list)):
        return type(out), tuple(meta_of(o) if isinstance(o, torch.Tensor) else None for o in out)
    if out is None:
        return "none", ()
    raise FallbackNeeded(f"{target} returns a non-tensor value")


def signature(target: Any, targs: tuple, tkw: tuple, inputs: list, sigs: list) -> OpSig:
    """The interned signature of one call; shape inference runs only the first time it is seen."""
    metas = tuple(sigs)
    # The cache is keyed by ``id(target)`` (an OpOverload hashes in Python); the interned OpSig
    # holds the target itself, so the id is not reused while the entry lives.
    ckey = (id(target), targs, tkw, metas)
    cache = tracer.sig_cache
    sig = cache.get(ckey)
    if sig is None:
        key = (target, targs, tkw, metas)
        t0 = perf_counter()
        try:
            struct, outs = _infer(target, targs, tkw, inputs, sigs)
        finally:
            metrics.add("infer_s", perf_counter() - t0)
        sig = cache[ckey] = OpSig(len(cache), key, struct, outs, user_site())
    return sig
