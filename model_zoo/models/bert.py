"""BERT masked-LM pre-training (transformers ``BertForMaskedLM(BertConfig(...))``, random weights).

Batches are padded like real pre-training data: every row has its own length (the tail is
``[PAD]`` with ``attention_mask`` 0), two segments (``token_type_ids`` 0 then 1), and 15% of the real
tokens replaced by ``[MASK]`` with labels only there (-100 elsewhere, so the loss averages over the
masked positions). ``default`` is ``BertConfig()`` (bert-base, 110M) at sequence 128.

Attention is ``eager`` with the explicit padding mask, as for the other transformers specs: the
eager mask is built from the 2-D mask by broadcasting and ``torch.where``. transformers 5's
``create_bidirectional_mask`` still probes ``padding_mask.all()`` on the host (to drop an all-ones
mask) whatever the attention implementation, so a lazy step has 1 implicit sync here (the SDPA path
has the same one). Dropout is 0 in ``tiny`` (lazy random streams differ from eager CPU's), 0.1 in
``default`` as in the library.
"""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec

# Special token ids (bert-base-uncased: [PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103); tiny uses 0..3.
_SPECIAL = {"tiny": (0, 1, 2, 3), "default": (0, 101, 102, 103)}


def build(attn: str = "eager", seq: int = 128, special: tuple = (), **cfg: object) -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    del seq, special
    config = BertConfig(**cfg)
    config._attn_implementation = attn
    return BertForMaskedLM(config)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    vocab, seq = cfg.get("vocab_size", 30522), cfg["seq"]
    pad, cls, sep, mask_id = cfg["special"]
    first = max(cfg["special"]) + 1  # ordinary tokens come after the special ids
    ids = torch.randint(first, vocab, (n, seq), generator=g)
    lengths = torch.randint(seq // 2, seq + 1, (n,), generator=g)
    lengths[0] = seq  # one full row per batch
    pos = torch.arange(seq).expand(n, seq)
    attention_mask = (pos < lengths[:, None]).long()
    split = (lengths // 2)[:, None]
    token_type_ids = ((pos >= split) & (attention_mask == 1)).long()
    ids[:, 0] = cls
    ids[pos == split - 1] = sep
    ids[pos == lengths[:, None] - 1] = sep
    ids[attention_mask == 0] = pad
    # Mask 15% of each row's ordinary tokens (at least one), chosen by a random ranking.
    real = (attention_mask == 1) & (ids != cls) & (ids != sep)
    score = torch.rand(n, seq, generator=g).masked_fill(~real, 2.0)
    rank = score.argsort(dim=1).argsort(dim=1)
    k = (real.sum(dim=1, keepdim=True) * 15 + 99) // 100
    chosen = rank < k
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    input_ids = torch.where(chosen, torch.full_like(ids, mask_id), ids)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
            "labels": labels}


def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    return model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], token_type_ids=b["token_type_ids"],
                 labels=b["labels"]).loss


SPECS = [ModelSpec(
    name="bert_base", family="transformer-encoder",
    traits={"task": "masked-lm", "norm": "layernorm", "activation": "gelu", "attention": "bidirectional-eager",
            "embedding": "token+learned-position+segment", "conv": "no", "recurrent": "no", "moe": "no"},
    configs={"tiny": {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "intermediate_size": 128, "max_position_embeddings": 32, "hidden_dropout_prob": 0.0,
                      "attention_probs_dropout_prob": 0.0, "pad_token_id": 0, "seq": 16,
                      "special": _SPECIAL["tiny"]},
             "default": {"seq": 128, "special": _SPECIAL["default"]}},
    batch_sizes={"tiny": 2, "default": 8},
    build_fn=build, batch_fn=batch, loss_fn=loss,
    optimizer_fn=lambda params: torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01),
    notes=__doc__.split("\n\n")[2].replace("\n", " ").strip(),
)]
