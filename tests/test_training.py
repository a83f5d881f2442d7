"""End-to-end training on mncore (pfvm:cpu) against eager PyTorch on CPU."""
from __future__ import annotations

import math

import pytest
import torch

import mncore
from tests.helpers import assert_same_training, ce, mlp, train

pytestmark = pytest.mark.unit


def _mlp_batches(width: int, n: int, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(64, width, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(n)]


def test_seed_mlp_loop_matches_eager():
    """The seed's loop: 4 x Linear(64)+ReLU, batch 64, SGD, 5 steps; float32, rtol 1e-5."""
    torch.manual_seed(0)
    model = mlp(64)
    batches = _mlp_batches(64, 5)
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    eager = train(model, batches, "cpu", sgd, ce)
    lazy = train(model, batches, "mncore", sgd, ce)
    assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("opt", ["sgd_momentum", "adam", "adamw"])
def test_optimizers_match_eager(opt: str, foreach: bool):
    torch.manual_seed(0)
    model = mlp(32, depth=2)
    batches = _mlp_batches(32, 4)
    make = {
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=foreach),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3, foreach=foreach),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=foreach),
    }[opt]
    eager = train(model, batches, "cpu", make, ce)
    lazy = train(model, batches, "mncore", make, ce)
    # Same algorithm, same float32 kernels; only summation order inside kernels may differ.
    assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6)


def test_resnet18_two_train_steps_match_eager():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(2, 3, 64, 64, generator=g), torch.randint(0, 1000, (2,), generator=g)) for _ in range(2)]
    sgd = lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)  # noqa: E731
    eager = train(model, batches, "cpu", sgd, ce)
    lazy = train(model, batches, "mncore", sgd, ce)
    # Identical kernels on identical inputs: batch-norm statistics and conv results agree to float32 noise.
    assert_same_training(eager, lazy, rtol=1e-4, atol=1e-5)


def _gpt2(dropout: float, attn: str = "eager"):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=32, vocab_size=128,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                  bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _lm_loss(model, ids, mask=None):
    return model(input_ids=ids, attention_mask=mask, labels=ids).loss


def _ids(n: int, seed: int = 5) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 128, (2, 16), generator=g),) for _ in range(n)]


def test_gpt2_adamw_matches_eager_without_dropout():
    model = _gpt2(0.0)
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    eager = train(model, _ids(2), "cpu", adamw, _lm_loss)
    lazy = train(model, _ids(2), "mncore", adamw, _lm_loss)
    # Eager CPU AdamW defaults to the for-loop form, mncore to foreach: the update is the same maths in
    # a different operation order, so parameters agree to a few float32 ulps of the update size.
    assert_same_training(eager, lazy, rtol=1e-4, atol=5e-5)


def test_gpt2_dropout_is_reproducible_and_has_the_right_rate():
    model = _gpt2(0.1)
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    torch.manual_seed(123)
    a = train(model, _ids(2), "mncore", adamw, _lm_loss)
    torch.manual_seed(123)
    b = train(model, _ids(2), "mncore", adamw, _lm_loss)
    assert a[0] == b[0]
    for k in a[1]:
        assert torch.equal(a[1][k], b[1][k]), k
    torch.manual_seed(7)
    c = train(model, _ids(2), "mncore", adamw, _lm_loss)
    assert c[0] != a[0]  # a different seed gives a different random stream

    torch.manual_seed(0)
    p = 0.3
    x = torch.ones(200_000).mncore()
    y = torch.nn.functional.dropout(x, p=p, training=True)
    mncore.sync()
    y = y.cpu()
    kept = (y != 0).double().mean().item()
    sd = math.sqrt(p * (1 - p) / y.numel())
    assert abs((1 - kept) - p) < 5 * sd  # 5 sigma: fails with probability < 1e-6
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / (1 - p)))


def test_attention_mask_value_read_goes_through_implicit_sync():
    """transformers' SDPA path calls padding_mask.all() mid-forward; the step must still be right."""
    model = _gpt2(0.0, attn="sdpa")
    mask = torch.ones(2, 16, dtype=torch.long)
    loss = lambda m, ids: _lm_loss(m, ids, mask.to(ids.device))  # noqa: E731
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-3)  # noqa: E731
    mncore.init_cpu(implicit_sync="silent")
    before = mncore.metrics.counters()["implicit_syncs"]
    eager = train(model, _ids(2), "cpu", adamw, loss)
    lazy = train(model, _ids(2), "mncore", adamw, loss)
    assert mncore.metrics.counters()["implicit_syncs"] - before >= 2
    assert_same_training(eager, lazy, rtol=1e-4, atol=5e-5)
