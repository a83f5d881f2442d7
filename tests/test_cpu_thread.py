"""pfvm:cpu runs a graph on the thread that submits it in ``sync`` and ``async`` modes
(``MNCORE_CPU_THREAD=auto``, the default, unless its memory plan is large; ``caller``: always), on the
worker with ``worker`` and always in ``async_naive``;
the numbers are eager PyTorch's either way, and an interrupt during a graph run on the caller leaves no
reader waiting."""
from __future__ import annotations

import copy
import importlib
import threading

import pytest
import torch

import mncore
from mncore.devices.pfvm import PfvmDevice
from mncore.errors import DeviceExecutionError
from tests.helpers import assert_same_training, ce, mlp, train

executor_module = importlib.import_module("mncore.execute.executor")  # the package's `executor` is the instance


def _case() -> tuple[torch.nn.Module, list]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return mlp(16), [(torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(4)]


def _sgd(p):
    return torch.optim.SGD(p, lr=0.05, momentum=0.9)


@pytest.fixture
def run_threads(monkeypatch) -> list[int]:
    """The thread identity of every ``PfvmDevice.run`` call."""
    seen: list[int] = []
    original = PfvmDevice.run

    def run(self, *args, **kwargs):
        seen.append(threading.get_ident())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PfvmDevice, "run", run)
    return seen


@pytest.mark.parametrize("execution, setting, max_bytes, on_caller", [
    ("async", "auto", executor_module.HERE_MAX_BYTES, True), ("sync", "auto", executor_module.HERE_MAX_BYTES, True),
    ("async", "auto", 0, False),  # every graph's plan peaks above 0 bytes: "large", so on the worker
    ("async", "caller", 0, True), ("sync", "caller", 0, True), ("async", "worker", None, False),
    ("sync", "worker", None, False), ("async_naive", "caller", None, False),
])
def test_graphs_run_on_the_thread_the_setting_names_with_eager_numbers(run_threads, monkeypatch, execution, setting,
                                                                        max_bytes, on_caller):
    if max_bytes is not None:
        monkeypatch.setattr(executor_module, "HERE_MAX_BYTES", max_bytes)
    mncore.init_cpu(execution=execution, implicit_sync="silent")
    model, batches = _case()
    eager = train(copy.deepcopy(model), batches, "cpu", _sgd, ce)
    with mncore.config.override(cpu_thread=setting):
        lazy = train(model, batches, "mncore", _sgd, ce)
        mncore.wait_device_ops()
    assert run_threads, "no graph ran"
    me = threading.get_ident()
    assert all((t == me) == on_caller for t in run_threads), (execution, setting, run_threads, me)
    assert_same_training(eager, lazy, rtol=1e-5, atol=1e-6)


def test_an_interrupt_during_a_graph_on_the_caller_fails_its_outputs_and_keeps_the_old_values(monkeypatch):
    mncore.init_cpu(execution="async", implicit_sync="silent")
    w = torch.nn.Parameter(torch.randn(4, 4)).mncore()
    before = w.detach().cpu().clone()
    original = PfvmDevice.run

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PfvmDevice, "run", interrupted)
    with torch.no_grad():
        w.mul_(2)
    loss = (w * 3).sum()
    with pytest.raises(KeyboardInterrupt):
        mncore.sync()
    monkeypatch.setattr(PfvmDevice, "run", original)
    got: dict[str, BaseException] = {}

    def read() -> None:
        try:
            loss.cpu()
        except DeviceExecutionError as e:
            got["error"] = e

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "a read of the interrupted graph's output waits forever"
    assert "interrupted" in str(got.get("error")), got
    # the parameter's write failed: it reads the value it had (a copy read back, nothing computed on it)
    assert torch.equal(w.detach().cpu(), before)
    with torch.no_grad():  # and the runtime goes on: the next graph runs and gives eager's numbers
        w.add_(1)
    torch.testing.assert_close(w.detach().cpu(), before + 1)
