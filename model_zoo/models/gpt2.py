"""GPT-2 small (transformers GPT2LMHeadModel(GPT2Config()), 124M, sequence 128), random weights.

``gpt2_small`` uses eager attention with an explicit attention mask: transformers' SDPA path
checks ``padding_mask.all()`` on the host when a mask is passed (an implicit sync per layer
stack), while eager attention builds the same additive causal mask without reading values, so
the maths is unchanged and the lazy step is one graph. ``gpt2_small_sdpa`` keeps the library
default (SDPA) for comparison.
"""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec


def build(attn: str = "eager", dropout: float = 0.1, **cfg: object) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    kwargs = {k: v for k, v in cfg.items() if k != "seq"}
    config = GPT2Config(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, **kwargs)
    config._attn_implementation = attn
    return GPT2LMHeadModel(config)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    vocab = cfg.get("vocab_size", 50257)
    ids = torch.randint(0, vocab, (n, cfg["seq"]), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["input_ids"]).loss


def _spec(name: str, attn: str) -> ModelSpec:
    return ModelSpec(
        name=name, family="transformer-decoder",
        traits={"task": "causal-lm", "norm": "layernorm", "activation": "gelu", "attention": f"causal-{attn}",
                "embedding": "token+learned-position", "conv": "no", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"attn": attn, "n_layer": 2, "n_embd": 64, "n_head": 2, "n_positions": 32,
                          "vocab_size": 128, "seq": 16, "bos_token_id": 0, "eos_token_id": 0},
                 "default": {"attn": attn, "seq": 128}},
        batch_sizes={"tiny": 2, "default": 2},
        build_fn=build, batch_fn=batch, loss_fn=loss,
        optimizer_fn=lambda params: torch.optim.AdamW(params, lr=1e-4),
        notes=__doc__.split("\n\n")[1].replace("\n", " ") if attn == "eager" else "library default attention (SDPA)",
        tags=("headline",) if attn == "eager" else (),
    )


SPECS = [_spec("gpt2_small", "eager"), _spec("gpt2_small_sdpa", "sdpa")]
