"""Adding a device is one class plus one registry line: a test-only device defined here, through the
public interface only (``mncore.Device``, ``mncore.RunResult``, ``mncore.register_device``), trains the
seed MLP and agrees with eager PyTorch on CPU."""
from __future__ import annotations

import pytest
import torch

import mncore
from tests.helpers import assert_same_training, ce, mlp, train


class InterpretingDevice(mncore.Device):
    """Runs each graph node by node with ``torch.fx.Interpreter`` (PyTorch CPU kernels) and counts jobs."""

    kind = "interp"
    forms = ("interp",)
    jobs = 0

    def run(self, exe, leaves, args, submitted):
        type(self).jobs += 1
        return mncore.RunResult(tuple(torch.fx.Interpreter(exe.gm).run(*args)))


@pytest.fixture
def interp_device():
    mncore.register_device(InterpretingDevice)
    try:
        yield InterpretingDevice
    finally:
        mncore.init_cpu()
        mncore.unregister_device(InterpretingDevice)


def test_registered_device_trains_the_seed_mlp_like_eager(interp_device):
    torch.manual_seed(0)
    model = mlp(64)
    batches = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(5)]
    make_opt = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    eager = train(model, batches, "cpu", make_opt, ce)
    mncore.init("interp")
    assert mncore.config.current().device == "interp" and mncore.config.current().kind == "interp"
    before_jobs, before = interp_device.jobs, mncore.metrics.counters()["graphs_executed"]
    lazy = train(model, batches, "mncore", make_opt, ce)
    mncore.wait_device_ops()
    assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6)
    ran = interp_device.jobs - before_jobs
    assert ran >= 5 and ran == mncore.metrics.counters()["graphs_executed"] - before


def test_registered_device_is_listed_and_validated(interp_device):
    assert mncore.parse_device(" INTERP ") == "interp"
    with pytest.raises(ValueError, match="interp"):
        mncore.init("nosuchdevice")


def test_register_device_refuses_what_is_not_a_device():
    with pytest.raises(TypeError, match="Device subclass"):
        mncore.register_device(object)
