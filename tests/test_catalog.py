"""The model catalog: generic config shrinking, trait derivation, the committed catalog file, the
representative set's coverage, the `harness zoo list|traits` commands and forked cells."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from harness import cells, tiers
from harness.cli import main as cli
from model_zoo import catalog
from model_zoo.catalog import Entry
from model_zoo.catalog.shrink import HEADS, HIDDEN, LAYERS, VOCAB, shrink
from model_zoo.catalog.traits import TRAITS, derive, ops_of_step

pytestmark = pytest.mark.unit


def test_shrink_cuts_sizes_and_keeps_attention_kinds():
    big = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 11008,
           "vocab_size": 32000, "eos_token_id": 31999, "pad_token_id": 0, "sliding_window": 4096,
           "layer_types": ["sliding_attention"] * 31 + ["full_attention"], "tie_word_embeddings": True,
           "text_config": {"model_type": "x", "hidden_size": 1024, "num_hidden_layers": 24}}
    for kv, kind in ((32, HEADS), (8, 2), (1, 1)):
        tiny = shrink(dict(big, num_key_value_heads=kv))
        assert tiny["num_key_value_heads"] == kind, (kv, tiny["num_key_value_heads"])
    tiny = shrink(dict(big, num_key_value_heads=8))
    assert (tiny["num_hidden_layers"], tiny["hidden_size"], tiny["num_attention_heads"]) == (LAYERS, HIDDEN, HEADS)
    assert tiny["vocab_size"] == VOCAB and tiny["eos_token_id"] < VOCAB and tiny["pad_token_id"] == 0
    assert tiny["layer_types"] == ["sliding_attention", "full_attention"]  # both layer kinds survive
    assert 0 < tiny["sliding_window"] < 16 and tiny["tie_word_embeddings"] is True
    assert tiny["text_config"]["hidden_size"] == HIDDEN and tiny["text_config"]["num_hidden_layers"] == LAYERS


def test_shrink_moves_a_backbones_outputs_onto_the_cut_stack():
    from transformers import Dinov2Config, SwinConfig

    stages = ["stem"] + [f"stage{i}" for i in range(1, 13)]
    one = shrink({"num_hidden_layers": 12, "stage_names": stages, "out_features": ["stage12"], "out_indices": [12]})
    assert (one["num_hidden_layers"], one["out_indices"], one["out_features"]) == (LAYERS, [LAYERS], [f"stage{LAYERS}"])
    four = shrink(Dinov2Config(num_hidden_layers=12, out_indices=[9, 10, 11, 12]).to_dict())
    assert four["num_hidden_layers"] == 4 and four["out_indices"] == [1, 2, 3, 4]  # a stage of its own each
    assert Dinov2Config.from_dict(four).out_features == ["stage1", "stage2", "stage3", "stage4"]  # the library agrees
    # stages that are not layers (Swin: one per entry of `depths`) keep their outputs as they were
    swin = SwinConfig(out_indices=[4]).to_dict()
    assert shrink(swin)["out_indices"] == [4] and SwinConfig.from_dict(shrink(swin)).out_features == ["stage4"]


def test_traits_of_a_small_cnn_come_from_its_modules_and_ops():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8),
                                torch.nn.Conv2d(8, 8, 3, groups=8), torch.nn.Conv2d(8, 4, 1),
                                torch.nn.Flatten(), torch.nn.LazyLinear(2))
    x = torch.randn(2, 3, 8, 8)
    ops = ops_of_step(lambda: torch.nn.functional.gelu(model(x)).sum().backward())  # gelu only as a function
    t = derive(model, "image-classification", ops)
    assert set(t) == set(TRAITS)
    assert t["conv"] == ["conv2d", "depthwise", "pointwise"] and t["norm"] == ["batchnorm"]
    assert t["activation"] == ["gelu"] and t["attention"] == ["none"] and t["recurrent"] == ["none"]
    assert t["params"] == ["<10k"] and t["tied"] == ["none"]


@pytest.mark.parametrize("kv,kind", [(4, "multi-head"), (2, "grouped-query"), (1, "multi-query")])
def test_attention_kind_follows_the_key_value_heads(kv, kind):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, num_key_value_heads=kv,
                           intermediate_size=64, vocab_size=64, sliding_window=8)
    t = derive(MistralForCausalLM(config), "causal-lm")
    assert t["attention"] == sorted([kind, "sliding-window"]) and t["position"] == ["rotary"]
    assert t["norm"] == ["rmsnorm"] and t["activation"] == ["silu"] and t["moe"] == ["none"]


def test_a_catalog_spec_builds_and_trains_a_step():
    import model_zoo

    spec = model_zoo.get("hf_llama")
    a, b = spec.make_batch("tiny", seed=1), spec.make_batch("tiny", seed=1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    model = spec.build("tiny")
    loss = model_zoo.train_step(spec, model, spec.optimizer(model.parameters()), a)
    assert math.isfinite(loss.item()) and sum(p.numel() for p in model.parameters()) < 10**6
    with pytest.raises(KeyError, match="harness zoo list --catalog"):
        model_zoo.get("hf_no_such_model")


@pytest.mark.parametrize("name,labels", [
    ("hf_clipseg", set()),  # contrastive image-text: its loss is asked for, not given labels
    ("hf_splinter", {"start_positions", "end_positions"}),
    ("hf_openai_privacy_filter", {"labels"}),
    ("hf_patchtst", {"target_values"}),
])
def test_heads_of_the_later_tasks_train_on_their_own_loss(name: str, labels: set[str]):
    import model_zoo
    from model_zoo.catalog import hf

    spec = model_zoo.get(name)
    batch = spec.make_batch("tiny", seed=0)
    assert labels <= batch.keys()
    model = spec.build("tiny").eval()  # no dropout: both calls below compute the same function
    options = {"return_loss": True} if spec.traits["task"] == "zero-shot-image-classification" else {}
    own = model(**batch, **options).loss  # the library's loss, which the catalog must train on
    assert own is not None and torch.allclose(spec.loss(model, batch), own)
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    loss = model_zoo.train_step(spec, model, spec.optimizer(model.parameters()), batch)
    assert math.isfinite(loss.item()) and any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert hf.candidates()[name][1] == spec.traits["task"]


def test_catalog_file_is_sorted_versioned_and_meets_its_targets():
    header, entries = catalog.load()
    names = [e.name for e in entries]
    assert header["format_version"] == catalog.FORMAT_VERSION and names == sorted(names) == sorted(set(names))
    ok = [e for e in entries if e.status == "ok"]
    assert header["ok"] == len(ok) and header["tried"] == len(entries)
    assert len(ok) >= 150 and len({e.family for e in ok}) >= 30, (len(ok), len({e.family for e in ok}))
    for e in entries:
        assert e.status in ("ok", "excluded") and (e.status == "ok") != bool(e.reason), e
        if e.status == "ok":
            assert set(e.traits) == set(TRAITS) and all(e.traits.values()), e.name
    assert set(catalog.candidates()) <= set(names), "candidates missing from the catalog: run harness zoo collect"


def _entry(name: str, params: int = 1, **traits: list[str]) -> Entry:
    return Entry(name=name, source="zoo", family="f", task="t", status="ok", params=params, traits=traits)


def test_representatives_are_a_greedy_cover_after_the_headline():
    head = tiers.HEADLINE[0][0]
    entries = [_entry(head, norm=["none"]), _entry("a", norm=["layernorm"], act=["relu"]),
               _entry("b", norm=["batchnorm"], act=["gelu"]), _entry("c", norm=["layernorm", "batchnorm"],
                                                                     act=["relu", "gelu", "silu"]),
               _entry("d", norm=["none"], act=["silu"])]
    assert tiers.representatives(entries) == [head, "c"]  # c alone covers what a, b and d cover


def test_models_tier_covers_every_catalog_trait_value():
    entries = catalog.built()
    tier = tiers.models_tier()
    assert tier[: len(tiers.HEADLINE)] == tiers.HEADLINE
    picked = {m for m, _ in tier}
    covered = {(k, v) for e in entries if e.name in picked for k, vs in e.traits.items() for v in vs}
    assert covered == {(k, v) for e in entries for k, vs in e.traits.items() for v in vs}


def test_zoo_list_filters_by_trait_and_refuses_bad_ones(capsys):
    assert cli(["zoo", "list", "--trait", "moe=top2"]) == 0
    out = capsys.readouterr().out
    want = {e.name for e in catalog.built() if "top2" in e.traits["moe"]}
    assert want and all(n in out for n in want) and f"{len(want)} models" in out
    assert cli(["zoo", "list", "--trait", "colour=red"]) == 2
    assert "--trait 'colour=red'" in capsys.readouterr().err
    assert cli(["zoo", "traits"]) == 0
    assert "representative set:" in capsys.readouterr().out


def test_forked_cells_keep_the_isolation(tmp_path: Path):
    """Cells forked from a preloaded fork server (``python -m json.tool IN OUT``): a result, a crash (bad
    JSON: exit 1 with the message) and a hang (reading a FIFO nobody writes), each as a started cell's."""
    import os

    (tmp_path / "good.json").write_text('{"a": 1}')
    (tmp_path / "bad.json").write_text("{not json")
    os.mkfifo(tmp_path / "never.json")
    jobs = [cells.Job(name, "json.tool", (str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.out")),
                      tmp_path / f"{name}.out") for name in ("good", "bad", "never")]
    t0 = time.monotonic()
    with cells.CellRunner(3, "forked", jobs=3, timeout=10, preload=("json",)) as runner:
        outcomes = runner.run(jobs, lambda o: o, status=lambda o: o.kind)
    assert [o.kind for o in outcomes] == ["result", "crash", "timeout"], outcomes
    assert json.loads((tmp_path / "good.out").read_text()) == {"a": 1}
    assert outcomes[1].returncode == 1 and "Expecting property name" in outcomes[1].reason
    assert time.monotonic() - t0 < 60


def test_full_report_counts_modes_and_groups_causes():
    from reports.full_tier import cause, mode_status, report

    base = {"model": "m", "config": "tiny", "backend": "b", "lazy_losses": [1.0], "context_losses": [1.0]}
    passed = dict(base, status="pass", reason="", lazy_captured_status="pass")
    ctx = dict(base, status="fail_to_run", reason="context: RuntimeError: data-dependent shape",
               context_losses=None, lazy_captured_status="pass")
    lazy = dict(base, status="fail_accuracy", reason="lazy vs eager: losses differ", lazy_captured_status="fail_accuracy")
    assert [mode_status(passed, m) for m in ("lazy", "context", "lazy_captured")] == ["pass"] * 3
    assert [mode_status(ctx, m) for m in ("lazy", "context", "lazy_captured")] == ["pass", "fail_to_run", "pass"]
    assert [mode_status(lazy, m) for m in ("lazy", "context")] == ["fail_accuracy", "unjudged"]
    assert cause(ctx) == "context: RuntimeError" and cause(lazy) == "lazy: wrong values"
    named = dict(ctx, reason="context: NotCompilableError: mncore: masked_select at loss.py:48 in f: its output ...")
    assert cause(named) == "context: NotCompilableError (masked_select)"
    text = report([passed, ctx, lazy])
    assert "| b | 3 | 1 (33%) | 2/3 (67%) | 1/3 (33%) | 2/3 (67%) |" in text, text
    assert "| b | context: RuntimeError | 1 | m |" in text
    # expectations rows (ci/expected) keep no losses: the modes before the failing one passed
    expected = [{k: v for k, v in r.items() if not k.endswith("_losses")} for r in (passed, ctx, lazy)]
    assert [mode_status(expected[1], m) for m in ("lazy", "context", "lazy_captured")] == ["pass", "fail_to_run", "pass"]
    assert report(expected) == text


def test_bad_backend_lists_and_candidates_are_refused(capsys):
    assert cli(["run", "--tier", "full", "--backend", "pfvm:cpu,pfvm:tpu", "--models", "mlp_w64"]) == 2
    assert "--backend: unknown device 'pfvm:tpu'" in capsys.readouterr().err
    assert cli(["zoo", "collect", "--models", "hf_llama,hf_nope"]) == 2
    assert "not catalog candidates: hf_nope" in capsys.readouterr().err
