"""What PyTorch expects of a device backend works with mncore, or fails with a clear error.

Reproduced first (after ``import mncore``): ``DataLoader(pin_memory=True)``, ``torch.load(...,
map_location="mncore")`` and ``torch.autocast("mncore")`` crashed inside PyTorch; ``x.to("mncore:1")``
silently used device 0; ``import mncore`` after a CPU backward pass hit an internal assert of the
autograd engine.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
import torch

import mncore


def test_import_after_a_cpu_backward_pass_works():
    code = (
        "import torch\n"
        "x = torch.randn(3, requires_grad=True); (x * 2).sum().backward()\n"
        "import mncore\nmncore.init_cpu()\n"
        "y = torch.ones(3).mncore().requires_grad_(); (y * 3).sum().backward(); mncore.sync()\n"
        "print(y.grad.cpu().tolist())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[3.0, 3.0, 3.0]"


def test_to_mncore_without_ever_importing_mncore_attaches_the_default_device():
    """The autoload entry point imports mncore at ``import torch``; the first tensor put on the device
    attaches ``MNCORE_DEVICE`` (no ``init`` call anywhere)."""
    code = (
        "import sys, torch\n"
        "x = torch.tensor([1.0, -2.0, 3.0]).to('mncore')\n"
        "y = torch.nn.Linear(3, 1).to('mncore')\n"
        "print((x.relu() * 2).cpu().tolist(), y.weight.device, sys.modules['mncore'].settings.device)\n"
    )
    env = dict(os.environ, MNCORE_DEVICE="pfvm:cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[2.0, 0.0, 6.0] mncore:0 pfvm:cpu"


def test_init_without_a_device_uses_mncore_device(monkeypatch):
    monkeypatch.setenv("MNCORE_DEVICE", "pfvm:cpu")
    mncore.init()
    assert mncore.settings.device == "pfvm:cpu"
    monkeypatch.setenv("MNCORE_DEVICE", "tpu:7")
    with pytest.raises(ValueError, match="tpu:7"):
        mncore.init()


def test_device_is_registered_at_import_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, torch; print('mncore' in sys.modules, "
                        "torch._C._get_privateuse1_backend_name())"], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["True", "mncore"], r.stderr


def test_cpu_module_conversion_and_loading_are_pytorchs_own():
    """mncore is imported at ``import torch`` in every program of its environment, so it must not change
    what CPU modules do. It used to turn PyTorch's global swap-on-conversion on: a parameter with a weak
    reference then failed ``load_state_dict`` and ``.double()``, and so did the deprecated
    ``torch.nn.utils.weight_norm``. Conversions to and from mncore swap on their own."""
    code = (
        "import sys, weakref, torch\n"
        "assert 'mncore' in sys.modules\n"
        "m = torch.nn.Linear(3, 2); ref = weakref.ref(m.weight); w = m.weight\n"
        "m.load_state_dict({'weight': torch.ones(2, 3), 'bias': torch.zeros(2)})\n"
        "m.double()\n"
        "wn = torch.nn.utils.weight_norm(torch.nn.Linear(3, 2)).half()\n"
        "print(torch.__future__.get_swap_module_params_on_conversion(), m.weight is w, m.weight.dtype,\n"
        "      m.weight.sum().item(), wn.weight_g.dtype)\n"
    )
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "torch.float64", "6.0", "torch.float16"]


def test_dataloader_pin_memory_feeds_mncore_training():
    data = torch.utils.data.TensorDataset(torch.arange(12.0).reshape(6, 2))
    batches = [b[0] for b in torch.utils.data.DataLoader(data, batch_size=3, pin_memory=True)]
    assert [b.tolist() for b in batches] == [[[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], [[6.0, 7.0], [8.0, 9.0], [10.0, 11.0]]]
    assert (batches[1].mncore() * 2).sum().item() == 102.0


def test_saving_an_mncore_tensor_loads_back_on_the_cpu():
    x = torch.arange(4.0).mncore() * 2
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    y = torch.load(buf)
    assert y.device.type == "cpu" and y.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("where", ["mncore:1", torch.device("mncore", 2)])
def test_other_device_indices_are_refused(where):
    with pytest.raises(ValueError, match="mncore has one device"):
        torch.ones(2).to(where)
    with pytest.raises(ValueError, match="mncore has one device"):
        torch.zeros(2, device=where)
    assert torch.ones(2).to("mncore:0").device == torch.device("mncore", 0)
