"""Encoder-decoder transformers from transformers configs (random weights): T5 and Whisper.

``t5_small``: ``T5ForConditionalGeneration(T5Config(...))`` -- RMS-style T5 LayerNorm (no mean, no
bias), ReLU feed-forward, bucketed relative-position bias instead of position embeddings, tied
input/output embeddings; ``labels`` are shifted right inside the model (decoder start = pad).
``default`` is ``T5Config()`` (t5-small, 60M) with 128 source / 32 target tokens.
``whisper_tiny``: ``WhisperForConditionalGeneration(WhisperConfig(...))`` -- two Conv1d + GELU over
random log-mel ``input_features`` (length 2 x ``max_source_positions``), sinusoidal encoder
positions, learned decoder positions, LayerNorm, GELU; ``default`` is ``WhisperConfig()``
(whisper-tiny size, 80 mel bins x 3000 frames) with 128 target tokens.

Both use ``eager`` attention with explicit masks (encoder ``attention_mask`` for T5, padded targets
with ``decoder_attention_mask`` for both): with SDPA, transformers' causal-mask builder tests the
padding mask's values on the host to decide whether ``is_causal`` suffices (an implicit sync in a
lazy-tensor backend); the eager mask is built by broadcasting without reading values and the maths is
the same. Measured per lazy tiny step: Whisper 0 implicit syncs (SDPA: 2), T5 2 (SDPA: 3) -- T5's
remaining two come from ``create_bidirectional_mask`` (encoder self-attention and cross-attention),
which probes ``padding_mask.all()`` whatever the attention implementation. Special ids sit inside the
tiny vocab; dropout is 0 in ``tiny`` (lazy random streams differ from eager CPU's) and the library's
value in ``default``.
"""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec

_BATCH_KEYS = ("src", "tgt")


def build_t5(attn: str = "eager", **cfg: object) -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(**{k: v for k, v in cfg.items() if k not in _BATCH_KEYS})
    config._attn_implementation = attn
    return T5ForConditionalGeneration(config)


def build_whisper(attn: str = "eager", **cfg: object) -> torch.nn.Module:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(**{k: v for k, v in cfg.items() if k not in _BATCH_KEYS})
    config._attn_implementation = attn
    return WhisperForConditionalGeneration(config)


def _padded_ids(n: int, seq: int, vocab: int, first: int, eos: int, pad: int, g: torch.Generator):
    """Random token rows of random length (>= seq/2, row 0 full) ending in ``eos``; returns ids and mask."""
    ids = torch.randint(first, vocab, (n, seq), generator=g)
    lengths = torch.randint(max(seq // 2, 2), seq + 1, (n,), generator=g)
    lengths[0] = seq
    pos = torch.arange(seq).expand(n, seq)
    mask = (pos < lengths[:, None]).long()
    ids[pos == lengths[:, None] - 1] = eos
    ids[mask == 0] = pad
    return ids, mask


def batch_t5(cfg: dict, n: int, g: torch.Generator) -> dict:
    vocab, pad, eos = cfg.get("vocab_size", 32128), cfg.get("pad_token_id", 0), cfg.get("eos_token_id", 1)
    first = max(pad, eos) + 1
    input_ids, attention_mask = _padded_ids(n, cfg["src"], vocab, first, eos, pad, g)
    labels, decoder_attention_mask = _padded_ids(n, cfg["tgt"], vocab, first, eos, pad, g)
    labels = labels.masked_fill(decoder_attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
            "decoder_attention_mask": decoder_attention_mask}


def loss_t5(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"],
                 decoder_attention_mask=b["decoder_attention_mask"]).loss


def batch_whisper(cfg: dict, n: int, g: torch.Generator) -> dict:
    vocab = cfg.get("vocab_size", 51865)
    pad, eos = cfg.get("pad_token_id", 50256), cfg.get("eos_token_id", 50256)
    first = 0 if vocab > 50258 else max(pad, eos, cfg.get("decoder_start_token_id", 50257)) + 1
    last = min(vocab, 50256)  # text tokens sit below <|endoftext|> in the real vocabulary
    frames = 2 * cfg.get("max_source_positions", 1500)
    features = torch.randn(n, cfg.get("num_mel_bins", 80), frames, generator=g)
    labels, decoder_attention_mask = _padded_ids(n, cfg["tgt"], last, first, eos, pad, g)
    labels = labels.masked_fill(decoder_attention_mask == 0, -100)
    return {"input_features": features, "labels": labels, "decoder_attention_mask": decoder_attention_mask}


def loss_whisper(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return model(input_features=b["input_features"], labels=b["labels"],
                 decoder_attention_mask=b["decoder_attention_mask"]).loss


def _adamw(params):
    return torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)


SPECS = [
    ModelSpec(
        name="t5_small", family="transformer-encoder-decoder",
        traits={"task": "seq2seq-lm", "norm": "rmsnorm", "activation": "relu", "attention": "encoder-decoder-eager",
                "embedding": "token+relative-bias", "conv": "no", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"vocab_size": 128, "d_model": 64, "d_kv": 32, "d_ff": 128, "num_layers": 2,
                          "num_decoder_layers": 2, "num_heads": 2, "relative_attention_num_buckets": 8,
                          "relative_attention_max_distance": 16, "dropout_rate": 0.0, "pad_token_id": 0,
                          "eos_token_id": 1, "decoder_start_token_id": 0, "src": 16, "tgt": 8},
                 "default": {"decoder_start_token_id": 0, "src": 128, "tgt": 32}},
        batch_sizes={"tiny": 2, "default": 8},
        build_fn=build_t5, batch_fn=batch_t5, loss_fn=loss_t5, optimizer_fn=_adamw,
        notes=__doc__.split("\n\n")[2].replace("\n", " ").strip(),
    ),
    ModelSpec(
        name="whisper_tiny", family="transformer-encoder-decoder",
        traits={"task": "speech-seq2seq", "norm": "layernorm", "activation": "gelu",
                "attention": "encoder-decoder-eager", "embedding": "token+sinusoidal+learned-position",
                "conv": "conv1d", "recurrent": "no", "moe": "no"},
        configs={"tiny": {"vocab_size": 128, "num_mel_bins": 16, "d_model": 64, "encoder_layers": 2,
                          "encoder_attention_heads": 2, "decoder_layers": 2, "decoder_attention_heads": 2,
                          "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_source_positions": 16,
                          "max_target_positions": 32, "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 1,
                          "decoder_start_token_id": 2, "begin_suppress_tokens": None, "suppress_tokens": None,
                          "tgt": 12},
                 "default": {"tgt": 128}},
        batch_sizes={"tiny": 2, "default": 8},
        build_fn=build_whisper, batch_fn=batch_whisper, loss_fn=loss_whisper, optimizer_fn=_adamw,
        notes=__doc__.split("\n\n")[2].replace("\n", " ").strip() + " Whisper's encoder takes no attention mask "
              "(fixed 30 s windows), so only the decoder side is masked.",
    ),
]
