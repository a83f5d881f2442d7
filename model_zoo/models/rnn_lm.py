"""Recurrent word-level language models in plain torch: embedding -> LSTM / GRU -> linear.

The PyTorch ``word_language_model`` recipe: dropout on the embedding and on the RNN output (and
between RNN layers), output projection tied to the embedding, cross-entropy on the next token
(inputs are tokens 0..T-1 of a window, targets tokens 1..T). ``default`` is the classic
Penn-Treebank "medium" model (Zaremba et al.): vocabulary 10k, 2 layers of 650, dropout 0.5,
BPTT length 35, batch 20. ``tiny``: vocabulary 128, 2 layers of 64, sequence 16, dropout 0 (lazy
random streams differ from eager CPU's, so the eager-vs-lazy check needs deterministic layers).
``nn.LSTM``/``nn.GRU`` on a non-CUDA device run aten's composite implementation (per time step
``linear`` + gates), so a step traces one cell per token and layer. Optimiser: Adam.
"""
from __future__ import annotations

import torch

from model_zoo.spec import ModelSpec


class RNNLM(torch.nn.Module):
    def __init__(self, cell: str, vocab_size: int, hidden: int, num_layers: int, dropout: float = 0.0,
                 tie_weights: bool = True) -> None:
        super().__init__()
        rnn = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell]
        self.embed = torch.nn.Embedding(vocab_size, hidden)
        self.drop = torch.nn.Dropout(dropout)
        self.rnn = rnn(hidden, hidden, num_layers, dropout=dropout if num_layers > 1 else 0.0, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab_size)
        if tie_weights:
            self.head.weight = self.embed.weight
        # word_language_model's init: N(0, 1) embeddings would give logits of std ~sqrt(hidden) through
        # the tied head (an initial loss far above log(vocab)).
        torch.nn.init.uniform_(self.embed.weight, -0.1, 0.1)
        torch.nn.init.zeros_(self.head.bias)
        if not tie_weights:
            torch.nn.init.uniform_(self.head.weight, -0.1, 0.1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.drop(self.embed(input_ids)))
        return self.head(self.drop(out))


def build(cell: str, vocab_size: int, hidden: int, num_layers: int, dropout: float = 0.0, tie_weights: bool = True,
          seq: int = 35) -> torch.nn.Module:
    del seq
    return RNNLM(cell, vocab_size, hidden, num_layers, dropout, tie_weights)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    window = torch.randint(0, cfg["vocab_size"], (n, cfg["seq"] + 1), generator=g)
    return {"input_ids": window[:, :-1].contiguous(), "targets": window[:, 1:].contiguous()}


def loss(model: torch.nn.Module, b: dict) -> torch.Tensor:
    logits = model(b["input_ids"])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].reshape(-1))


def _spec(cell: str) -> ModelSpec:
    return ModelSpec(
        name=f"{cell}_lm", family="rnn-lm",
        traits={"task": "causal-lm", "norm": "none", "activation": "sigmoid+tanh", "attention": "none",
                "embedding": "token", "conv": "no", "recurrent": cell, "moe": "no"},
        configs={"tiny": {"cell": cell, "vocab_size": 128, "hidden": 64, "num_layers": 2, "dropout": 0.0, "seq": 16},
                 "default": {"cell": cell, "vocab_size": 10000, "hidden": 650, "num_layers": 2, "dropout": 0.5,
                             "seq": 35}},
        batch_sizes={"tiny": 4, "default": 20},
        build_fn=build, batch_fn=batch, loss_fn=loss,
        optimizer_fn=lambda params: torch.optim.Adam(params, lr=1e-3),
        notes=f"{cell.upper()} word LM, tied embedding/output weights; default = PTB medium (2 x 650, BPTT 35)",
    )


SPECS = [_spec("lstm"), _spec("gru")]
