"""Architectural traits derived from a built module and its config, never written by hand.

Every trait is a list of values (a model can have two norm kinds, several activations); the
representative set covers every (trait, value) the catalog holds. Values come from module classes
(``torch.nn`` types and, for library classes, their names: ``LlamaRMSNorm`` is an RMS norm) and from
the config's fields (key/value heads, sliding windows, experts, position encodings).
"""
from __future__ import annotations

from typing import Any

import torch

TRAITS = ("task", "norm", "activation", "attention", "position", "conv", "recurrent", "moe", "tied", "params")
_ACTS = (("hardswish", "hardswish"), ("hardsigmoid", "hardsigmoid"), ("gelu", "gelu"), ("silu", "silu"),
         ("swish", "silu"), ("relu6", "relu6"), ("leakyrelu", "leaky-relu"), ("prelu", "prelu"), ("relu", "relu"),
         ("mish", "mish"), ("tanh", "tanh"), ("sigmoid", "sigmoid"), ("softplus", "softplus"), ("elu", "elu"))
_NORMS = (("rmsnorm", "rmsnorm"), ("batchnorm", "batchnorm"), ("groupnorm", "groupnorm"),
          ("instancenorm", "instancenorm"), ("layernorm", "layernorm"), ("localresponsenorm", "lrn"))


# aten ops (as a training step runs them) that show an activation or a norm even when it is called
# functionally (``F.relu``), with no module to name it
_OP_ACTS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh",
            "hardswish": "hardswish", "hardsigmoid": "hardsigmoid", "elu": "elu", "leaky_relu": "leaky-relu",
            "mish": "mish", "softplus": "softplus", "hardtanh": "relu6", "_prelu_kernel": "prelu"}
_OP_NORMS = {"native_batch_norm": "batchnorm", "_native_batch_norm_legit": "batchnorm",
             "_native_batch_norm_legit_no_training": "batchnorm", "native_layer_norm": "layernorm",
             "native_group_norm": "groupnorm", "_fused_rms_norm": "rmsnorm"}


def ops_of_step(fn: Any) -> set[str]:
    """The aten op names (``relu``, ``native_layer_norm``...; in-place ones without their ``_``) that ``fn()``
    runs, forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.add(func._schema.name.split("::", 1)[-1].rstrip("_"))  # relu_ is relu
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


def _with_ops(found: list[str], ops: set[str], table: dict[str, str]) -> list[str]:
    values = (set(found) | {v for op, v in table.items() if op in ops}) - {"none"}
    return sorted(values) or ["none"]


def _names(model: torch.nn.Module) -> list[str]:
    return [type(m).__name__.lower() for m in model.modules()]


def _matches(names: list[str], table: tuple) -> list[str]:
    """The value of the first key (most specific first: prelu before relu) each class name contains."""
    found = {next((value for key, value in table if key in n), None) for n in names} - {None}
    return sorted(found) or ["none"]


def _conv(model: torch.nn.Module) -> list[str]:
    kinds = set()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.conv._ConvNd):
            dims = len(m.kernel_size)
            kinds.add(f"{'transposed' if m.transposed else 'conv'}{dims}d")
            if m.groups > 1:
                kinds.add("depthwise" if m.groups == m.in_channels else "grouped")
            if all(k == 1 for k in m.kernel_size):
                kinds.add("pointwise")
    return sorted(kinds) or ["none"]


def _recurrent(names: list[str]) -> list[str]:
    kinds = {v for n in names for k, v in (("lstm", "lstm"), ("gru", "gru"), ("mamba", "state-space"),
                                            ("ssm", "state-space"), ("rwkv", "rwkv")) if k in n}
    kinds |= {"rnn" for n in names if n in ("rnn", "rnncell")}
    return sorted(kinds) or ["none"]


def _attention(model: torch.nn.Module, config: Any, names: list[str]) -> list[str]:
    if not any("attention" in n or "multiheadattention" in n or n.endswith("attn") for n in names):
        return ["none"]
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    kv = getattr(config, "num_key_value_heads", None)
    kinds = {"multi-head"}
    if isinstance(kv, int) and isinstance(heads, int):
        kinds = {"multi-query"} if kv == 1 else {"grouped-query"} if kv < heads else kinds
    if getattr(config, "sliding_window", None) or getattr(config, "attention_window", None):
        kinds.add("sliding-window")
    if getattr(config, "is_encoder_decoder", False):
        kinds.add("cross")
    if any("window" in n for n in names):
        kinds.add("windowed")
    return sorted(kinds)


def _position(model: torch.nn.Module, config: Any, names: list[str]) -> list[str]:
    kinds = set()
    if any("rotary" in n or "rope" in n for n in names) or getattr(config, "rope_theta", None) or \
            getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None):
        kinds.add("rotary")
    if getattr(config, "alibi", False) or any("alibi" in n for n in names):
        kinds.add("alibi")
    if getattr(config, "relative_attention_num_buckets", None) or \
            getattr(config, "position_embedding_type", "") in ("relative_key", "relative_key_query"):
        kinds.add("relative")
    if any("sinusoidal" in n for n in names):
        kinds.add("sinusoidal")
    for name, m in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(m, torch.nn.Embedding) and ("position" in leaf or leaf in ("wpe", "embed_positions")):
            kinds.add("learned")
    if any(isinstance(p, torch.nn.Parameter) and "position" in n for n, p in model.named_parameters()):
        kinds.add("learned")
    return sorted(kinds) or ["none"]


def _moe(config: Any) -> list[str]:
    experts = next((getattr(config, k) for k in ("num_local_experts", "num_experts", "n_routed_experts",
                                                 "moe_num_experts") if isinstance(getattr(config, k, None), int)), 0)
    if experts <= 1:
        return ["none"]
    k = next((getattr(config, n) for n in ("num_experts_per_tok", "top_k", "moe_topk")
              if isinstance(getattr(config, n, None), int)), None)
    return [f"top{k}" if k else "experts"]


def _tied(model: torch.nn.Module) -> list[str]:
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    try:
        inp, out = (get_in() if get_in else None), (get_out() if get_out else None)
    except (NotImplementedError, AttributeError):
        return ["none"]
    if inp is None or out is None or not hasattr(out, "weight"):
        return ["none"]
    return ["tied"] if out.weight is getattr(inp, "weight", None) else ["untied"]


def params_bucket(n: int) -> str:
    """Parameters by decade: <10k, <100k, <1M, <10M, <100M, >=100M."""
    for bound, label in ((10**4, "<10k"), (10**5, "<100k"), (10**6, "<1M"), (10**7, "<10M"), (10**8, "<100M")):
        if n < bound:
            return label
    return ">=100M"


def derive(model: torch.nn.Module, task: str, ops: set[str] = frozenset()) -> dict[str, list[str]]:
    """Every trait of ``model`` (its ``config``, if it has one, adds heads, windows, experts, positions;
    ``ops``, the aten ops of its training step, add functional activations and norms)."""
    config = getattr(model, "config", None)
    names = _names(model)
    acts = _matches(names, _ACTS)
    hidden_act = str(getattr(config, "hidden_act", None) or getattr(config, "activation_function", None) or "")
    from_config = _matches([hidden_act.replace("_", "").lower()], _ACTS) if hidden_act else []
    acts = _with_ops(sorted(set(acts) | set(from_config)), ops, _OP_ACTS)
    return {
        "task": [task], "norm": _with_ops(_matches(names, _NORMS), ops, _OP_NORMS), "activation": acts,
        "attention": _attention(model, config, names), "position": _position(model, config, names),
        "conv": _conv(model), "recurrent": _recurrent(names), "moe": _moe(config), "tied": _tied(model),
        "params": [params_bucket(sum(p.numel() for p in model.parameters()))],
    }
