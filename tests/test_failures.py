"""A failing graph fails the values it would have produced and nothing else.

Reproduced first with an out-of-range embedding index in one training step (only the kernel can
tell; shape inference cannot): before the fix every later step, every read of the weight and
``Context.synchronize()`` re-raised the old error, an unrelated read raised it too, and in
``execution="sync"`` the error surfaced one ``sync()`` late. References are eager PyTorch on CPU.
"""
from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

import mncore
from mncore.context import Context, MNDevice, prepare_for_compile, set_buffer_name_in_optimizer, \
    set_tensor_name_in_module
from tests.helpers import doubling_with_backward


class Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 1)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(idx)).pow(2).mean()


def _good(step: int) -> torch.Tensor:
    return torch.tensor([step % 10, (3 * step) % 10])


BAD = torch.tensor([1, 99])  # index 99 of a 10-row table


def _eager(model: torch.nn.Module, steps: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for idx in steps:
        opt.zero_grad()
        model(idx).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("execution", ["async", "sync"])
def test_lazy_step_after_a_failed_step_uses_the_last_good_weights(execution):
    mncore.init_cpu(implicit_sync="silent", execution=execution)
    torch.manual_seed(0)
    ref_model = Embedder()
    model = copy.deepcopy(ref_model).mncore()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(idx: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = model(idx.mncore())
        loss.backward()
        opt.step()
        return loss

    step(_good(0))
    mncore.sync()
    bad_loss = step(BAD)
    if execution == "sync":  # the sync() that ran the failing graph raises, not the next one
        with pytest.raises(mncore.DeviceExecutionError, match="embedding"):
            mncore.sync()
    else:
        mncore.sync()
        with pytest.raises(mncore.DeviceExecutionError, match="embedding"):
            mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        bad_loss.item()  # the value the failed graph would have produced
    for i in (1, 2):
        step(_good(i))
        mncore.sync()  # no old error: later steps with good inputs work
    mncore.wait_device_ops()
    want = _eager(ref_model, [_good(0), _good(1), _good(2)])  # the failed step changed nothing
    got = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")


def test_error_names_graph_op_and_the_users_source_line():
    mncore.init_cpu(implicit_sync="silent")
    table = torch.randn(11, 3).mncore()  # a signature no other test traced: its first site is here
    out = torch.nn.functional.embedding(BAD.mncore(), table) * 3  # the line the error must name
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError) as e:
        mncore.wait_device_ops()
    msg = str(e.value)
    assert "failed at op aten.embedding" in msg and "graph_" in msg
    assert "test_failures.py" in msg and "in test_error_names_graph_op_and_the_users_source_line" in msg
    del out


def test_unrelated_read_does_not_raise_an_old_error():
    mncore.init_cpu(implicit_sync="silent")
    table = torch.randn(10, 4).mncore()
    bad = torch.nn.functional.embedding(BAD.mncore(), table)
    mncore.sync()
    ok = torch.arange(3.0).mncore() * 2  # pending: reading it cuts a graph implicitly
    assert ok.tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(mncore.DeviceExecutionError, match="embedding"):
        bad.cpu()
    with pytest.raises(mncore.DeviceExecutionError, match="embedding"):
        mncore.wait_device_ops()  # still reported once at the next explicit wait
    mncore.wait_device_ops()  # ... and only once


def test_context_good_updates_are_written_back_around_a_failed_call(tmp_path):
    torch.manual_seed(0)
    ref_model = Embedder()
    model = copy.deepcopy(ref_model)
    opt = prepare_for_compile(torch.optim.SGD(model.parameters(), lr=0.1))
    set_tensor_name_in_module(model, "model")
    set_buffer_name_in_optimizer(opt, "opt")
    ctx = Context(MNDevice("pfvm:cpu"))
    for p in model.parameters():
        ctx.register_param(p)
    ctx.register_optimizer_buffers(opt)

    def train_step(inputs: dict) -> dict:
        opt.zero_grad()
        loss = model(inputs["idx"])
        loss.backward()
        opt.step()
        return {"loss": loss}

    compiled = ctx.compile(train_step, {"idx": _good(0)}, tmp_path / "step")
    compiled({"idx": _good(0)})
    compiled({"idx": BAD})
    compiled({"idx": _good(1)})
    with pytest.raises(mncore.DeviceExecutionError, match="embedding"):
        ctx.synchronize()
    want = _eager(ref_model, [_good(0), _good(1)])
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=1e-5, atol=1e-6, msg=lambda m: f"{k}: {m}")
    ctx.synchronize()  # the error was reported once
    Context.switch_context(Context(MNDevice("pfvm:cpu")))


def test_failure_in_flight_at_exit_is_reported():
    code = ("import torch, mncore\nmncore.init_cpu()\nt = torch.randn(10, 4).mncore()\n"
            "out = torch.nn.functional.embedding(torch.tensor([99]).mncore(), t)\nmncore.sync()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "a graph failed after the last sync()" in r.stderr and "embedding" in r.stderr, r.stderr


def test_failure_the_user_read_is_not_reported_again_at_exit():
    """The report at exit says nothing read the failed graph's results: after a read raised the error that
    would be false (it was printed on every such run)."""
    code = ("import torch, mncore\nmncore.init_cpu(implicit_sync='silent')\nt = torch.randn(10, 4).mncore()\n"
            "out = torch.nn.functional.embedding(torch.tensor([99]).mncore(), t)\nmncore.sync()\ntry:\n"
            "    out.cpu()\nexcept mncore.DeviceExecutionError as e:\n    print('raised', 'embedding' in str(e))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "raised True" and "failed after the last sync()" not in r.stderr, (r.stdout, r.stderr)


def test_host_to_device_copy_counts_against_simulated_dram(sim_env):
    """Reproduced first: ``.mncore()`` of 12 MB on a 1 MB board succeeded and the OOM hit a later graph."""
    mncore.init("emu2")
    from mncore.errors import DeviceOutOfMemoryError

    mncore.wait_device_ops()
    resident = mncore.observe.live_bytes()
    sim_env.setenv("MNCORE_SIM_DRAM_BYTES", str(resident + (1 << 20)))
    small = torch.ones(1000).mncore()  # 4 kB fits
    with pytest.raises(DeviceOutOfMemoryError, match=r"copying a \(3000, 1000\) torch.float32 tensor \(12,000,000 bytes\)"):
        torch.ones(3000, 1000).mncore()
    assert (small * 2).sum().item() == 2000.0  # what fits still works


# -- directories mncore writes to: a clear error naming the knob and the fix, never a raw OSError


def _train_one(x: torch.Tensor) -> None:
    (x.mncore() * 2).sum().item()


def test_cache_dir_that_is_a_file_or_unwritable(monkeypatch, tmp_path):
    from mncore.cache import memory
    from mncore.errors import DirectoryError

    a_file = tmp_path / "cache"
    a_file.write_text("not a directory")
    monkeypatch.setenv("MNCORE_CACHE_DIR", str(a_file))
    memory.clear()
    with pytest.raises(DirectoryError, match=r"compile cache directory .*cache .*is a file"):
        _train_one(torch.ones(3))
    monkeypatch.setenv("MNCORE_CACHE_DIR", str(a_file / "sub"))  # cannot be created: its parent is a file
    memory.clear()
    with pytest.raises(DirectoryError, match=r"cannot create the compile cache directory.*MNCORE_CACHE_READONLY=1"):
        _train_one(torch.ones(4))
    monkeypatch.setenv("MNCORE_CACHE_READONLY", "1")  # the fix the message names works
    memory.clear()
    _train_one(torch.ones(4))


def test_runtime_dir_that_is_a_file(sim_env, tmp_path):
    from mncore.errors import DirectoryError

    a_file = tmp_path / "runtime-file"
    a_file.write_text("")
    sim_env.setenv("MNCORE_RUNTIME_DIR", str(a_file))
    with pytest.raises(DirectoryError, match="MNCORE_RUNTIME_DIR"):
        mncore.init("mncore2:auto")
    assert mncore.settings.device == "pfvm:cpu"  # a failed init leaves the runtime as it was


def test_codegen_dir_none_or_a_file(tmp_path, monkeypatch):
    ctx = Context(MNDevice("pfvm:cpu"))
    fn = lambda d: {"y": d["x"] * 2}  # noqa: E731
    with pytest.raises(TypeError, match="codegen_dir must be a directory path"):
        ctx.compile(fn, {"x": torch.ones(2)}, None)
    a_file = tmp_path / "out.txt"
    a_file.write_text("")
    with pytest.raises(ValueError, match="is a file; give a directory"):
        ctx.compile(fn, {"x": torch.ones(2)}, a_file)
    Context.switch_context(Context(MNDevice("pfvm:cpu")))
    from mncore.errors import DirectoryError
    from mncore.cache import memory

    monkeypatch.setenv("MNCORE_CODEGEN_DIR", str(a_file))
    memory.clear()
    with pytest.raises(DirectoryError, match="codegen directory"):
        _train_one(torch.ones(5))


# -- errors during backward: a Python exception, never an aborted process

_BACKWARD_PROGRAM = r"""
import torch, mncore
mncore.init("emu2")
cases = {
    "multi_margin_loss": (torch.nn.MultiMarginLoss(), torch.randn(3, 5), torch.tensor([1, 0, 4])),
    "multilabel_margin_loss": (torch.nn.MultiLabelMarginLoss(), torch.randn(3, 5), torch.tensor([[1, 0, -1, 2, 3]] * 3)),
}
for name, (loss_fn, x, target) in cases.items():
    x = x.mncore().requires_grad_()
    try:
        loss_fn(x, target.mncore()).backward()
        mncore.sync()
        print(name, "no error")
    except RuntimeError as e:
        print(name, "RuntimeError", str(e).replace("\n", " "))
"""


def test_backward_errors_are_python_exceptions_not_an_abort(tmp_path):
    """Reproduced first: on emu2/mncore2 (static shapes) these losses' backward ops have no meta kernel,
    the refusal was raised inside autograd's engine and the process aborted (exit 134, "terminate
    called without an active exception"), or raised ``SystemError ... returned NULL``."""
    # MNCORE_FALLBACK=error: these backward ops have no meta kernel, so by default they would run on the host
    env = dict(__import__("os").environ, MNCORE_RUNTIME_DIR=str(tmp_path), MNCORE_FALLBACK="error")
    r = subprocess.run([sys.executable, "-c", _BACKWARD_PROGRAM], capture_output=True, text=True, timeout=240,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for name in ("multi_margin_loss", "multilabel_margin_loss"):
        assert lines[name].startswith("RuntimeError"), lines
        assert f"aten.{name}_backward.default failed during backward with StaticShapeError" in lines[name]


def test_error_in_backward_on_pfvm_reaches_the_caller():
    Broken = doubling_with_backward(lambda g: g @ torch.ones(7, 7, device=g.device))  # a shape error in backward
    x = torch.ones(3).mncore().requires_grad_()
    with pytest.raises(RuntimeError, match=r"aten.mm.default failed during backward with RuntimeError"):
        Broken.apply(x).sum().backward()
    assert (x.detach() + 1).tolist() == [2.0, 2.0, 2.0]  # the runtime keeps working
