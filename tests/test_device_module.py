"""``torch.mncore`` (the device module PyTorch calls) and ``torch.load(map_location='mncore')``.

Reproduced first: ``torch.mncore`` had no ``initial_seed``/``seed``/``is_bf16_supported``, its RNG
state was an int64 tensor that could not hold a 64-bit seed, and ``torch.load(map_location='mncore')``
refused to load. References: eager CPU tensors and the same program on the CPU.
"""
from __future__ import annotations

import io

import pytest
import torch

import mncore


def test_device_queries():
    mod = torch.mncore
    assert mod.is_available() and mod.is_initialized()
    assert mod.device_count() == 1 and mod.current_device() == 0
    assert mod.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert mod.is_bf16_supported() and mod.is_bf16_supported(including_emulation=False)  # pfvm: PyTorch's kernels
    mod.set_device(0)
    with pytest.raises(ValueError, match="mncore has one device"):
        mod.set_device(1)


def test_bf16_is_emulated_on_the_simulated_board(sim_env):
    mncore.init("emu2")
    assert torch.mncore.is_bf16_supported()
    assert not torch.mncore.is_bf16_supported(including_emulation=False)


def test_synchronize_waits_for_submitted_graphs():
    x = torch.randn(64, 64)
    y = x.mncore() @ x.mncore()
    mncore.sync()
    torch.mncore.synchronize()
    leaf = y.mn_storage.value[0]
    assert leaf.ready.is_set()
    torch.testing.assert_close(y.cpu(), x @ x)


def _draw() -> torch.Tensor:
    return torch.rand(5, device="mncore").cpu()


def test_manual_seed_and_initial_seed():
    torch.manual_seed(1234)
    assert torch.mncore.initial_seed() == 1234
    first = _draw()
    torch.mncore.manual_seed(1234)
    torch.testing.assert_close(_draw(), first, rtol=0, atol=0)  # the same stream, bit for bit
    torch.mncore.manual_seed_all(99)
    assert torch.mncore.initial_seed() == 99
    torch.mncore.seed()
    assert torch.mncore.initial_seed() != 99  # a non-deterministic 64-bit seed (p = 2**-64 of a clash)


def test_rng_state_round_trip_replays_the_stream():
    torch.manual_seed(2**64 - 1)  # the largest seed torch accepts: the state must hold 64 bits
    _draw()
    state = torch.mncore.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
    want = _draw()
    torch.mncore.set_rng_state(state)
    torch.testing.assert_close(_draw(), want, rtol=0, atol=0)
    torch.mncore.set_rng_state_all(torch.mncore.get_rng_state_all())
    with pytest.raises(ValueError, match="uint8 tensor of 16 bytes"):
        torch.mncore.set_rng_state(torch.zeros(2, dtype=torch.int64))


def test_fork_rng_restores_the_mncore_stream():
    torch.manual_seed(7)
    with torch.random.fork_rng(device_type="mncore"):
        inside = _draw()
    after = _draw()
    torch.testing.assert_close(after, inside, rtol=0, atol=0)


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("where", ["mncore", "mncore:0", torch.device("mncore"), torch.device("mncore", 0)])
def test_torch_load_a_state_dict_onto_the_device(where):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    state = torch.load(_saved(cpu_model.state_dict()), map_location=where)
    assert all(v.device == torch.device("mncore", 0) for v in state.values())
    for k, v in cpu_model.state_dict().items():
        torch.testing.assert_close(state[k].cpu(), v, rtol=0, atol=0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("mncore")
    model.load_state_dict(state)
    x = torch.randn(3, 4)
    torch.testing.assert_close(model(x.mncore()).cpu(), cpu_model(x))


def test_torch_load_a_whole_module_onto_the_device_and_train_it():
    torch.manual_seed(0)
    cpu_model = torch.nn.Linear(3, 2)
    model = torch.load(_saved(cpu_model), map_location="mncore", weights_only=False)
    assert isinstance(model.weight, torch.nn.Parameter) and model.weight.device.type == "mncore"
    x = torch.randn(4, 3)
    cpu_model(x).square().sum().backward()
    model(x.mncore()).square().sum().backward()
    torch.testing.assert_close(model.weight.grad.cpu(), cpu_model.weight.grad)


def test_torch_load_elsewhere_is_untouched_and_other_indices_are_refused():
    buf = _saved({"w": torch.arange(3.0)})
    assert torch.load(buf, map_location="cpu")["w"].device.type == "cpu"
    buf.seek(0)
    assert torch.load(buf)["w"].device.type == "cpu"
    buf.seek(0)
    with pytest.raises(ValueError, match="mncore has one device"):
        torch.load(buf, map_location="mncore:1")
