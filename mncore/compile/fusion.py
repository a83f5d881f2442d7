"""Operator classes and fusion into kernels (TVM's four classes, seed 003).

* injective: pure data movement (views, reshapes, copies, concatenation, scatter-inverses);
* elementwise: pointwise maths, factories and random generators;
* reduction: ops that fold dimensions (sums, norms, softmax);
* complex: matmul, conv and attention, which accept an elementwise epilogue;
* opaque: everything else (indexing, sorting, gathers), never fused.

A kernel made only of view ops (transpose, reshape, slicing) is a *view* kernel: the device
reads its input with another layout, so it costs no time and no traffic and its outputs alias
its input in the memory plan.

Fusion walks the graph in order. An injective or elementwise node joins the kernel of its
producers when they all sit in one kernel that is elementwise-only or anchored by a complex op
(an epilogue); a reduction joins an elementwise-only kernel (a prologue); complex and opaque ops
start kernels. Joining only a kernel that holds *all* of a node's producers keeps the kernel
graph acyclic.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
MAX_KERNEL_OPS = 512

_INJECTIVE = {
    "clone", "_to_copy", "copy", "cat", "stack", "lift_fresh_copy", "alias", "detach", "contiguous", "reshape",
    "slice_scatter", "select_scatter", "as_strided_scatter", "diagonal_scatter", "constant_pad_nd", "flip", "roll",
    "repeat", "expand_copy", "permute_copy", "view_copy", "t_copy", "transpose_copy", "tril", "triu",
}
_REDUCTION = {
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "var_mean", "std_mean",
    "norm", "linalg_vector_norm", "logsumexp", "_softmax", "_log_softmax", "_softmax_backward_data",
    "_log_softmax_backward_data", "native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "native_batch_norm_backward", "native_group_norm", "native_group_norm_backward", "cumsum", "cumprod", "any",
    "all", "mse_loss", "mse_loss_backward", "_fused_rms_norm", "_fused_rms_norm_backward", "nll_loss_forward",
    "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "avg_pool2d", "avg_pool2d_backward", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool2d_backward", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
}
_COMPLEX = {
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "convolution", "convolution_backward",
    "_convolution", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward", "_grouped_mm",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
}
_ELEMENTWISE_FACTORIES = {"full", "zeros", "ones", "empty", "empty_strided", "scalar_tensor", "arange", "full_like",
                          "zeros_like", "ones_like", "empty_like", "rand", "randn", "rand_like", "randn_like",
                          "bernoulli", "native_dropout", "native_dropout_backward", "fill", "masked_fill", "where"}
# pointwise, though PyTorch does not tag them so (traced whole: trace/register.py FUSED_ON_CPU)
_ELEMENTWISE_UNTAGGED = {"mish_backward"}


def base_op(target: Any) -> Any:
    """The aten overload behind a graph target (random ops, mutating-op wrappers and built-in substitutes
    hold one; a mutating-op wrapper may hold a substitute)."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    for attr in ("op", "fn"):
        inner = getattr(target, attr, None)
        if not isinstance(inner, torch._ops.OpOverload):
            inner = getattr(inner, "op", None)  # a mutating-op wrapper around a built-in substitute
        if isinstance(inner, torch._ops.OpOverload):
            return inner
    return target


def op_class(target: Any) -> str:
    """'injective' | 'elementwise' | 'reduction' | 'complex' | 'opaque' for one graph target."""
    if target is operator.getitem:
        return "injective"
    op = base_op(target)
    if not isinstance(op, torch._ops.OpOverload):
        return "elementwise"
    name = op._schema.name.split("::")[-1].rstrip("_")
    if name in _COMPLEX:
        return "complex"
    if op.is_view or name in _INJECTIVE:
        return "injective"
    if name in _REDUCTION:
        return "reduction"
    if (torch.Tag.pointwise in op.tags or name in _ELEMENTWISE_FACTORIES or name in _ELEMENTWISE_UNTAGGED
            or name.startswith("_foreach_") or getattr(target, "custom", None)):
        return "elementwise"
    return "opaque"


_VIEW_LIKE = {"reshape", "_unsafe_view", "view", "t", "permute", "transpose", "expand", "squeeze", "unsqueeze",
              "slice", "select", "alias", "detach", "as_strided", "split", "unbind", "chunk", "narrow"}


def is_view(target: Any) -> bool:
    """Ops that only reinterpret a buffer's layout: on the device they cost no kernel and no traffic."""
    if target is operator.getitem:
        return True
    return isinstance(target, torch._ops.OpOverload) and (
        target.is_view or target._schema.name.split("::")[-1] in _VIEW_LIKE)


def numel(meta: Any) -> int:
    return math.prod(meta.shape) if meta is not None else 0


def _meta_tensor(x: Any) -> Any:
    if isinstance(x, fx.Node):
        m = x.meta["mn"][0]
        if m is None:
            return x.meta.get("example", 0)
        return torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta_tensor(y) for y in x)
    return x


def node_flops(node: fx.Node, cls: str) -> int:
    """FLOPs of one node: PyTorch's flop formulas for matmul/conv/attention, one per element otherwise."""
    metas = node.meta["mn"]
    out = sum(numel(m) for m in metas)
    if cls == "injective":
        return 0
    if cls == "reduction":
        return max([numel(a.meta["mn"][0]) for a in node.all_input_nodes if a.meta["mn"][0] is not None] + [out])
    if cls != "complex":
        return out
    op = base_op(node.target)
    formula = flop_registry.get(op.overloadpacket)
    args = _meta_tensor(node.args)
    if formula is not None:
        outs = [torch.empty(m.shape, dtype=m.dtype, device="meta") if m is not None else None for m in metas]
        return int(formula(*args, **_meta_tensor(node.kwargs), out_val=outs[0] if len(outs) == 1 else tuple(outs)))
    # attention kernels without a formula (the CPU flash kernels): 4*B*H*L*S*E forward, twice that backward
    q, k = args[0], args[1]
    if "attention" in op._schema.name and q.dim() == 4:
        f = 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
        return f * (2 if "backward" in op._schema.name else 1)
    return 2 * out * (args[0].shape[-1] if args and isinstance(args[0], torch.Tensor) and args[0].dim() else 1)


@dataclass(eq=False)
class Kernel:
    """One fused kernel: its nodes in order, its class and what it costs."""

    index: int
    anchor: str | None  # None (elementwise/injective only) | 'reduction' | 'complex' | 'opaque'
    nodes: list[fx.Node] = field(default_factory=list)
    inputs: list[fx.Node] = field(default_factory=list)
    outputs: list[fx.Node] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0
    fmt: str = "float"
    time_s: float = 0.0
    bound: str = "memory"

    @property
    def kind(self) -> str:
        if self.anchor:
            return self.anchor
        if all(is_view(n.target) for n in self.nodes):
            return "view"
        return "injective" if all(n.meta["mn_class"] == "injective" for n in self.nodes) else "elementwise"

    def describe(self) -> dict[str, Any]:
        return {"kernel": self.index, "kind": self.kind, "format": self.fmt,
                "ops": [_op_name(n.target) for n in self.nodes if n.target is not operator.getitem],
                "inputs": [n.name for n in self.inputs], "outputs": [n.name for n in self.outputs],
                "flops": self.flops, "bytes": self.bytes, "modelled_s": self.time_s, "bound": self.bound}


def _op_name(target: Any) -> str:
    return str(base_op(target)) if isinstance(base_op(target), torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def fuse(graph: fx.Graph) -> list[Kernel]:
    """Group the graph's call nodes into kernels; fills each kernel's inputs, outputs and FLOPs."""
    kernels: list[Kernel] = []
    home: dict[fx.Node, Kernel] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        cls = node.meta["mn_class"] = op_class(node.target)
        producers = {home[a] for a in node.all_input_nodes if a in home}
        only = next(iter(producers)) if len(producers) == 1 else None
        k = None
        if node.target is operator.getitem:
            k = only  # names one output of its producer: always in the producer's kernel
        elif only is not None and len(only.nodes) < MAX_KERNEL_OPS:
            if cls in ("injective", "elementwise") and only.anchor in (None, "complex"):
                k = only
            elif cls == "reduction" and only.anchor is None:
                k = only
                k.anchor = "reduction"
        if k is None:
            k = Kernel(index=len(kernels), anchor=None if cls in ("injective", "elementwise") else cls)
            kernels.append(k)
        k.nodes.append(node)
        home[node] = k
        node.meta["mn_flops"] = node_flops(node, cls)
    for k in kernels:
        members = set(k.nodes)
        seen: set = set()
        for n in k.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in seen:
                    seen.add(a)
                    k.inputs.append(a)
            if any(u not in members for u in n.users) and not _is_tuple_value(n):
                k.outputs.append(n)
        k.flops = sum(n.meta["mn_flops"] for n in k.nodes)
    return kernels


def _is_tuple_value(node: fx.Node) -> bool:
    """A multi-output node is only read through getitem nodes; those are the kernel's outputs."""
    return node.meta.get("mn_tuple", False)
