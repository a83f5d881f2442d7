"""The training recipes (``model_zoo.recipes``): each trains on CPU, and a lazy step on mncore (pfvm:cpu)
gives eager's loss and updated parameters; the shape registry holds every recipe's rows.

Recipes whose step draws random numbers (``rrelu``, alpha dropout) cannot agree
with eager in value: lazy random streams differ from eager CPU's by design (README, "Randomness"). For
them the lazy step must run, give a finite loss and update the parameters with their shapes and dtypes.
"""
from __future__ import annotations

import math

import pytest
import torch

import mncore
from harness.registry_cmd import DEFAULT_PATH
from model_zoo import batch_to, get, recipes, train_step
from shape_registry import Registry

pytestmark = pytest.mark.unit

RANDOM = {"recipe_layer_rrelu", "recipe_layer_alpha_dropout", "recipe_layer_feature_alpha_dropout"}


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def test_every_group_is_named_and_found():
    names = recipes.candidates()
    assert len(names) == len(set(names))
    for group in ("optim", "clip", "loss", "layer"):
        assert any(n.startswith(f"{recipes.PREFIX}{group}_") for n in names), group
    assert get(names[0]).name == names[0]
    with pytest.raises(KeyError, match="unknown zoo model 'recipe_nope'"):
        get("recipe_nope")


def test_registry_holds_every_recipe():
    """`harness registry record --recipes` recorded each recipe, eagerly and lazily."""
    held = Registry.load(DEFAULT_PATH).models
    missing = [n for n in recipes.candidates() if f"{n}:tiny" not in held]
    assert not missing, f"not in the registry (run `harness registry record --recipes --jobs 2`): {missing}"


@pytest.mark.parametrize("name", recipes.candidates())
def test_lazy_step_matches_eager(name: str):
    spec = get(name)
    eager, lazy = spec.build("tiny", seed=0), spec.build("tiny", seed=0)
    before = _state(eager)
    steps = [spec.make_batch("tiny", seed=s) for s in range(2)]  # the second step has optimizer state
    opt = spec.optimizer(eager.parameters())
    want_loss = [train_step(spec, eager, opt, b).detach() for b in steps][-1]

    mncore.init_cpu(implicit_sync="silent")
    lazy.to("mncore")
    opt = spec.optimizer(lazy.parameters())
    for b in steps:
        got_loss = train_step(spec, lazy, opt, batch_to(b, "mncore"))
        mncore.sync()
    want, got = _state(eager), _state(lazy)
    assert math.isfinite(got_loss.item()) and math.isfinite(want_loss.item())
    assert any(not torch.equal(got[k], before[k]) for k, _ in lazy.named_parameters()), f"{name}: no update"
    if name in RANDOM:
        assert {k: (v.shape, v.dtype) for k, v in got.items()} == {k: (v.shape, v.dtype) for k, v in want.items()}
        return
    torch.testing.assert_close(got_loss.detach().cpu(), want_loss, rtol=1e-4, atol=1e-6)
    for k in want:  # two optimizer steps: float32 summation order moves an update by a few ulps of its size
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {k}: {m}")
