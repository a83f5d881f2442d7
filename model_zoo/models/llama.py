"""Llama-style decoders from transformers configs (random weights): dense Llama and Mixtral MoE.

All: RMSNorm (pre-norm), rotary position embeddings, SwiGLU feed-forward (SiLU gate x up -> down),
grouped-query attention (fewer key/value heads than query heads). The Mixtral specs replace each
feed-forward with ``num_local_experts`` SwiGLU experts behind a top-2 softmax router; the loss adds
the router load-balancing term (``output_router_logits=True``, coefficient 0.001) as Mixtral
training does.

Default sizes: ``LlamaConfig()`` / ``MixtralConfig()`` are the 7B / 8x7B (46.7B) models, which no
runner here can train, so ``default`` uses realistic small members of each architecture: ``llama``
is SmolLM-135M's published Llama config (576 wide, 30 layers, 9 heads / 3 KV heads, SwiGLU 1536,
vocab 49152, tied embeddings, rope theta 1e4) at sequence 256; the Mixtral specs are a ~180M
Mixtral (512 wide, 8 layers, 8 heads / 4 KV heads, 8 experts of 1408, top-2, vocab 32000, untied).

Attention is ``eager`` with an explicit all-ones ``attention_mask``: transformers' SDPA mask builder
tests ``padding_mask`` values on the host to decide whether it can rely on ``is_causal`` (an implicit
sync in a lazy-tensor backend), while the eager mask is built by broadcasting without reading values;
the maths is the same. Passing the mask also skips the packed-sequence check on ``position_ids``
(another host read). bos/eos/pad ids sit inside the tiny vocab.

Experts implementation (``config._experts_implementation``), one spec each:
``mixtral_moe`` keeps transformers' default ``grouped_mm`` (sort token-expert pairs by expert,
``histc`` + ``cumsum`` offsets, ``torch.nn.functional.grouped_mm``; static shapes, the offsets are
values); ``mixtral_moe_batched_mm`` gathers each token's top-2 expert weights and runs two ``bmm``
(static shapes and no value reads, but it materialises (tokens x top-2) weight copies, so its
``default`` uses 1 x 32 tokens, ~4 GB of gathered weights kept for backward, ~9 GB peak for an eager
CPU step); ``mixtral_moe_eager_experts`` is the reference loop (``nonzero`` over the hit experts, a
Python loop, ``torch.where`` per expert: value-dependent shapes, host reads).
"""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec


def build_llama(attn: str = "eager", seq: int = 256, **cfg: object) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    del seq
    config = LlamaConfig(**cfg)
    config._attn_implementation = attn
    return LlamaForCausalLM(config)


def build_mixtral(attn: str = "eager", experts: str = "grouped_mm", seq: int = 256, **cfg: object) -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    del seq
    config = MixtralConfig(**cfg)
    config._attn_implementation = attn
    config._experts_implementation = experts
    return MixtralForCausalLM(config)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    first = max(cfg.get("bos_token_id", 1), cfg.get("eos_token_id", 2), cfg.get("pad_token_id") or 0) + 1
    ids = torch.randint(first, cfg.get("vocab_size", 32000), (n, cfg["seq"]), generator=g)
    ids[:, 0] = cfg.get("bos_token_id", 1)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["input_ids"]).loss


_TINY_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _adamw(params):
    return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)


_MIXTRAL_TINY = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                 "num_local_experts": 4, "num_experts_per_tok": 2, "output_router_logits": True, **_TINY_IDS, "seq": 16}
_MIXTRAL_DEFAULT = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096,
                    "num_local_experts": 8, "num_experts_per_tok": 2, "output_router_logits": True,
                    "bos_token_id": 1, "eos_token_id": 2, "seq": 256}
_NOTES = " ".join(p.replace("\n", " ") for p in __doc__.split("\n\n")[2:4]).strip()
_MOE_NOTES = " ".join(p.replace("\n", " ") for p in __doc__.split("\n\n")[2:5]).strip()


def _mixtral(name: str, experts: str, default_batch: int = 4, default_seq: int = 256, tags: tuple = ()) -> ModelSpec:
    return ModelSpec(
        name=name, family="llama-decoder",
        traits={"task": "causal-lm", "norm": "rmsnorm", "activation": "swiglu", "attention": "causal-gqa-eager",
                "embedding": "token+rotary", "conv": "no", "recurrent": "no", "moe": "top2"},
        configs={"tiny": {**_MIXTRAL_TINY, "experts": experts},
                 "default": {**_MIXTRAL_DEFAULT, "experts": experts, "seq": default_seq}},
        batch_sizes={"tiny": 2, "default": default_batch},
        build_fn=build_mixtral, batch_fn=batch, loss_fn=loss, optimizer_fn=_adamw,
        notes=f"experts_implementation={experts!r}. " + _MOE_NOTES, tags=tags,
    )


SPECS = [
    ModelSpec(
        name="llama", family="llama-decoder",
        traits={"task": "causal-lm", "norm": "rmsnorm", "activation": "swiglu", "attention": "causal-gqa-eager",
                "embedding": "token+rotary", "conv": "no", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                          **_TINY_IDS, "seq": 16},
                 "default": {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                             "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                             "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                             "initializer_range": 0.041666666666666664, "tie_word_embeddings": True,
                             "bos_token_id": 0, "eos_token_id": 0, "seq": 256}},
        batch_sizes={"tiny": 2, "default": 4},
        build_fn=build_llama, batch_fn=batch, loss_fn=loss, optimizer_fn=_adamw,
        notes=_NOTES,
    ),
    _mixtral("mixtral_moe", "grouped_mm"),
    _mixtral("mixtral_moe_batched_mm", "batched_mm", default_batch=1, default_seq=32),
    _mixtral("mixtral_moe_eager_experts", "eager"),
]
