"""Shrink any transformers config to a tiny one, generically: every size field is matched by name.

A model type's default config describes its released size (often billions of parameters); the
catalog needs each model to build and train a step on CPU in seconds, so layers, widths, heads,
key/value heads, feed-forward sizes, vocabularies, positions, image and patch sizes and experts are
cut by the rules below, in nested sub-configs (text/vision/audio, encoder/decoder) too. Ratios that
decide an architectural trait survive: key/value heads stay 1 (multi-query), fewer than the heads
(grouped) or equal (multi-head); a sliding window stays set (and smaller than the sequence).
"""
from __future__ import annotations

from typing import Any, Callable

LAYERS, HIDDEN, HEADS, FFN, VOCAB, POSITIONS, EXPERTS, TOP_K = 2, 32, 4, 64, 256, 64, 4, 2
HEAD_DIM = HIDDEN // HEADS
SEQ = 16  # the token batches' sequence length (sliding windows are made smaller than it)
IMAGE, PATCH = 32, 4


def _cap(limit: int) -> Callable[[Any], Any]:
    return lambda v: min(v, limit) if v > 0 else v


def _kv_heads(v: int) -> int:
    """1 stays 1 (multi-query); any other count becomes grouped (2 of 4; ``shrink`` keeps it equal to
    the heads where it was)."""
    return v if v <= 1 else 2


_INT_RULES: dict[str, Callable[[Any], Any]] = {}
for _names, _rule in (
    (("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_encoder_layers", "num_decoder_layers",
      "encoder_layers", "decoder_layers", "num_blocks", "depth", "text_layers", "vision_layers",
      "num_self_attention_layers", "num_cross_attention_layers",
      "num_stacks", "num_hidden_groups", "decoder_num_layers", "encoder_num_layers"), _cap(LAYERS)),
    (("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim", "d_embed", "embedding_size",
      "encoder_hidden_size", "decoder_hidden_size", "word_embed_proj_dim", "projection_dim", "hidden_dim",
      "n_embed", "d_inner_hidden", "output_hidden_size", "text_embed_dim", "vision_embed_dim",
      "classifier_proj_size", "proj_codevector_dim", "codevector_dim", "tdnn_dim"), _cap(HIDDEN)),
    (("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
      "n_heads", "num_attention_heads_per_block", "decoder_num_attention_heads"), _cap(HEADS)),
    (("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num", "n_kv_heads",
      "num_key_value_groups"), _kv_heads),
    (("head_dim", "attention_head_size", "d_head", "d_kv", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
      "kv_lora_rank", "q_lora_rank", "qk_head_dim"), _cap(HEAD_DIM)),
    (("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner", "d_inner",
      "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_intermediate_size",
      "inner_hidden_size", "intermediate_dim", "mlp_dim", "expert_intermediate_size"), _cap(FFN)),
    (("vocab_size", "n_vocab", "decoder_vocab_size", "target_vocab_size", "src_vocab_size", "tgt_vocab_size"),
     _cap(VOCAB)),
    (("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length", "n_ctx",
      "max_source_positions", "max_target_positions", "seq_length", "max_length", "context_length"),
     _cap(POSITIONS)),
    (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_layer"),
     _cap(EXPERTS)),
    (("num_experts_per_tok", "top_k", "moe_topk", "num_selected_experts", "moe_top_k"), _cap(TOP_K)),
    (("n_shared_experts", "num_shared_experts", "first_k_dense_replace"), _cap(1)),
    (("sliding_window", "attention_window_size"), _cap(SEQ // 2)),
    (("image_size", "img_size", "input_size", "crop_size"), _cap(IMAGE)),
    (("patch_size",), _cap(PATCH)),
):
    for _n in _names:
        _INT_RULES[_n] = _rule
_LIST_OF_WIDTHS = ("hidden_sizes", "embed_dims", "dims", "channels", "widths", "hidden_dims", "neck_hidden_sizes",
                   "conv_dim")
_LIST_OF_HEADS = ("num_heads", "num_attention_heads", "heads")
_LIST_OF_DEPTHS = ("depths", "num_layers", "block_repeats", "stage_depths", "layers")
_SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
_PER_LAYER = ("layer_types", "block_types", "mlp_only_layers", "sliding_window_pattern", "attention_layers",
              "layers_block_type", "hybrid_override_pattern")


def _shrink_list(key: str, v: list) -> list:
    """Per-stage lists (widths, heads, depths): kept as long (a stage per entry), each entry cut."""
    if not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return v
    if key in _LIST_OF_WIDTHS:
        return [min(x, HIDDEN * 2 ** min(i, 2)) for i, x in enumerate(v)]
    if key in _LIST_OF_HEADS:
        return [min(x, 2) for x in v]
    if key in _LIST_OF_DEPTHS:
        return [min(x, 1) for x in v]
    return v


def _keep_layer_pattern(v: list, n: int) -> list:
    """A per-layer list cut to ``n`` layers that keeps the first and the last kind (e.g. sliding, full)."""
    return v[:1] * (n - 1) + v[-1:] if n > 1 else v[:1]


def _cut_out_stages(out: dict[str, Any], layer_key: str) -> None:
    """A backbone's feature outputs (``out_indices``/``out_features``) moved onto the cut stack when its stages
    are its layers (no per-stage depth list): as many outputs as before, on its last stages (enough layers
    are kept for each to be its own)."""
    picks, n = out.get("out_indices"), out[layer_key]
    if not (isinstance(picks, list) and picks and all(isinstance(i, int) for i in picks) and max(picks) > n
            and isinstance(out.get("stage_names"), list)) or any(isinstance(out.get(k), list) for k in _LIST_OF_DEPTHS):
        return
    n = out[layer_key] = max(n, len(picks))
    out["out_indices"] = list(range(n - len(picks) + 1, n + 1))
    out["out_features"] = [f"stage{i}" for i in out["out_indices"]]
    out["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, n + 1)]


def shrink(cfg: dict[str, Any]) -> dict[str, Any]:
    """A tiny copy of a config's ``to_dict()`` (sub-configs, dicts with a ``model_type``, shrunk too)."""
    out: dict[str, Any] = {}
    for key, v in cfg.items():
        if isinstance(v, dict) and ("model_type" in v or key.endswith("_config") or key in ("encoder", "decoder")):
            out[key] = shrink(v)
        elif isinstance(v, bool) or v is None:
            out[key] = v
        elif isinstance(v, int) and key in _INT_RULES:
            out[key] = _INT_RULES[key](v)
        elif isinstance(v, (list, tuple)) and key in _INT_RULES and len(v) == 2 and all(isinstance(x, int) for x in v):
            out[key] = [_INT_RULES[key](x) for x in v]  # (height, width) image and patch sizes
        elif isinstance(v, list):
            out[key] = _shrink_list(key, v)
        else:
            out[key] = v
    for heads, kv in (("num_attention_heads", "num_key_value_heads"), ("n_head", "n_head_kv")):
        if isinstance(cfg.get(kv), int) and cfg.get(kv) == cfg.get(heads):
            out[kv] = out[heads]  # as many key/value heads as heads: multi-head attention stays multi-head
    layer_key = next((k for k in ("num_hidden_layers", "num_layers", "n_layer") if isinstance(out.get(k), int)), None)
    if layer_key is not None:
        _cut_out_stages(out, layer_key)
    layers = out[layer_key] if layer_key is not None else None
    for key in _PER_LAYER:
        if isinstance(out.get(key), list) and layers is not None and len(out[key]) > layers:
            out[key] = _keep_layer_pattern(out[key], layers)
    vocab = out.get("vocab_size")
    if isinstance(vocab, int):
        for key, v in out.items():  # special token ids must stay inside the smaller vocabulary
            if key.endswith("_token_id") and isinstance(v, int) and not isinstance(v, bool) and v >= vocab:
                out[key] = _SPECIAL_IDS.get(key, 3)
    return out
