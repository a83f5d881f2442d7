"""Runtime behaviour: compile cache, implicit sync modes, errors, buffers, modes, observability."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import mncore
from tests.helpers import mlp

pytestmark = pytest.mark.unit


def _step_fn(model, opt, x, y):
    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x.mncore()), y.mncore())
        loss.backward()
        opt.step()
        mncore.sync()
        return loss
    return step


def _setup(width=16, lr=0.1, momentum=0.0):
    torch.manual_seed(0)
    model = mlp(width, depth=2).mncore()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    x, y = torch.randn(8, width), torch.randint(0, 10, (8,))
    return model, opt, x, y


def test_second_identical_step_compiles_nothing():
    step = _step_fn(*_setup(momentum=0.9))
    step()
    step()  # momentum buffers now exist: the steady-state graph
    mncore.wait_device_ops()
    before = mncore.metrics.counters()
    step()
    mncore.wait_device_ops()
    after = mncore.metrics.counters()
    assert after["compiles"] == before["compiles"]
    assert after["cache_hits"] == before["cache_hits"] + 1
    assert after["graphs_executed"] == before["graphs_executed"] + 1
    assert after["traced_ops"] > before["traced_ops"]


def test_scheduled_learning_rate_does_not_recompile():
    model, opt, x, y = _setup()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    step = _step_fn(model, opt, x, y)
    step()
    sched.step()
    step()
    sched.step()
    mncore.wait_device_ops()
    before = mncore.metrics.counters()["compiles"]
    for _ in range(3):
        step()
        sched.step()
    mncore.wait_device_ops()
    assert mncore.metrics.counters()["compiles"] == before


def test_changed_shape_recompiles_and_debug_explains(capfd):
    mncore.init_cpu(implicit_sync="silent")
    from mncore.trace.state import tracer
    tracer.record_frames = True
    mncore.settings.debug = frozenset({"recompile"})
    try:
        a = torch.randn(4, 4).mncore()
        (a * 2).sum()
        b = (a * 2).sum()
        mncore.sync()
        c = (torch.randn(5, 4).mncore() * 2).sum()
        mncore.sync()
        assert torch.allclose(b.cpu(), (a.cpu() * 2).sum())
        del c
    finally:
        mncore.settings.debug = frozenset()
        tracer.record_frames = False
    err = capfd.readouterr().err
    assert "mncore[recompile]" in err
    assert "input shapes/dtypes changed" in err
    assert "test_runtime.py" in err  # the Python frame that traced the differing op


def test_recompile_env_var_in_subprocess():
    code = (
        "import torch, mncore; mncore.init_cpu()\n"
        "for n in (3, 4):\n"
        "    x = torch.ones(n).mncore(); y = (x + 1).sum(); mncore.sync(); print(y.item())\n"
    )
    env = dict(os.environ, MNCORE_DEBUG="recompile")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6.0", "8.0"]
    assert "mncore[recompile]" in r.stderr


@pytest.mark.parametrize("mode", ["sync", "async_naive", "async"])
def test_execution_modes_give_identical_results(mode):
    mncore.init_cpu(execution=mode)
    step = _step_fn(*_setup())
    losses = [step() for _ in range(4)]
    got = [l.item() for l in losses]
    mncore.init_cpu(execution="sync")
    step = _step_fn(*_setup())
    ref = [step().item() for _ in range(4)]
    assert got == ref


def test_implicit_sync_warn_once_per_call_site():
    mncore.init_cpu(implicit_sync="warn")
    before = mncore.metrics.counters()["implicit_syncs"]
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.ones(3).mncore() + 1
            assert x.sum().item() == 6.0  # one call site, three implicit syncs
    msgs = [w for w in rec if issubclass(w.category, mncore.ImplicitSyncWarning)]
    assert len(msgs) == 1
    assert "test_runtime.py" in str(msgs[0].message) and ".item()" in str(msgs[0].message)
    assert mncore.metrics.counters()["implicit_syncs"] - before == 3


def test_implicit_sync_in_code_without_a_file_names_its_line_not_backward():
    """`python -c`, the REPL and notebooks run user code from ``<string>``/``<stdin>``-named frames: the
    warning names that line, not "autograd engine thread ... in backward" (no backward ran)."""
    code = ("import warnings, torch, mncore\nmncore.init_cpu(implicit_sync='warn')\n"
            "warnings.simplefilter('always')\nx = torch.ones(3).mncore() * 2\nprint(x.cpu().tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "[2.0, 2.0, 2.0]" in out.stdout, out.stderr
    assert "at <string>:5 in <module>" in out.stderr and "backward" not in out.stderr, out.stderr


def test_implicit_sync_error_mode_raises_and_keeps_state():
    mncore.init_cpu(implicit_sync="error")
    x = torch.ones(3).mncore() * 2
    with pytest.raises(mncore.ImplicitSyncError, match=r"\.cpu\(\)"):
        x.cpu()
    mncore.sync()
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]  # after an explicit sync the read is fine


def test_implicit_sync_silent_mode_and_env_var(monkeypatch):
    mncore.init_cpu(implicit_sync="silent")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (torch.ones(2).mncore() * 3).tolist() == [3.0, 3.0]
    monkeypatch.setenv("MNCORE_IMPLICIT_SYNC", "error")
    mncore.init_cpu()
    with pytest.raises(mncore.ImplicitSyncError):
        float((torch.ones(()).mncore() + 1))


def test_bool_and_print_are_implicit_syncs():
    mncore.init_cpu(implicit_sync="silent")
    before = mncore.metrics.counters()["implicit_syncs"]
    x = torch.tensor([1.0, -1.0]).mncore()
    if (x > 0).any():
        pass
    assert "device='mncore:0'" in repr(x * 2)
    assert mncore.metrics.counters()["implicit_syncs"] - before == 2


@pytest.mark.parametrize("bad", ["tpu", "pfvm:gpu", "cuda", "", "pfvm:cuda:x"])
def test_unknown_device_lists_valid_ones(bad):
    with pytest.raises(ValueError, match="pfvm:cpu"):
        mncore.init(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_gpu_says_so():
    with pytest.raises(ValueError, match="CUDA"):
        mncore.init_cuda()
    with pytest.raises(ValueError, match="pfvm:cuda:7"):
        mncore.init("pfvm:cuda:7")


def test_nonexistent_board_is_rejected(monkeypatch):
    monkeypatch.setenv("MNCORE_SIM_BOARDS", "2")
    with pytest.raises(ValueError, match="2 simulated board") as e:
        mncore.init("mncore2:2")
    assert "mncore2:1" in str(e.value)
    with pytest.raises(ValueError, match="sim_mode"):
        mncore.init("emu2", sim_mode="fast")
    with pytest.raises(ValueError, match="float_dtype"):
        mncore.init("emu2", float_dtype="bf16")
    assert mncore.settings.device == "pfvm:cpu"  # a failed init leaves the runtime as it was


def test_bad_modes_are_rejected():
    with pytest.raises(ValueError, match="implicit_sync"):
        mncore.init_cpu(implicit_sync="loud")
    with pytest.raises(ValueError, match="execution"):
        mncore.init_cpu(execution="eager")


def test_use_before_init_with_a_bad_default_device_is_a_clear_error():
    """Used before init, mncore attaches MNCORE_DEVICE (test_torch_integration.py); a bad one is named."""
    code = ("import torch, mncore\ntry:\n    torch.ones(2).mncore()\n"
            "except mncore.errors.NotInitializedError as e:\n    print(e)\n")
    env = dict(os.environ, MNCORE_DEVICE="tpu:3")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "used before mncore.init(), and its default device (MNCORE_DEVICE='tpu:3') cannot be attached" \
        in r.stdout, r.stderr


def test_worker_error_names_graph_and_op():
    mncore.init_cpu(implicit_sync="silent")
    table = torch.randn(10, 4).mncore()
    idx = torch.tensor([1, 99]).mncore()  # out of range: only the kernel can tell, not shape inference
    out = torch.nn.functional.embedding(idx, table) * 2
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match=r"graph_\w+ failed at op aten\.embedding"):
        mncore.wait_device_ops()
    with pytest.raises(mncore.DeviceExecutionError):
        out.cpu()  # the value of a failed graph never silently appears
    ok = torch.ones(2).mncore() + 1  # the runtime keeps working afterwards
    mncore.sync()
    assert ok.tolist() == [2.0, 2.0]


def test_shape_errors_raise_at_trace_time():
    a, b = torch.ones(2, 3).mncore(), torch.ones(4, 5).mncore()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied|same reduction dim"):
        a @ b
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(2, 3)


def test_live_buffers_stay_flat_over_500_steps():
    mncore.init_cpu(implicit_sync="error")
    step = _step_fn(*_setup(width=8, momentum=0.9))
    for _ in range(5):
        step()
    mncore.wait_device_ops()
    gc.collect()  # garbage left by earlier tests in this process; the loop itself needs no collection
    warm = mncore.metrics.counters()["live_buffers"]
    seen = set()
    for i in range(500):
        step()
        if i % 50 == 49:
            mncore.wait_device_ops()
            seen.add(mncore.metrics.counters()["live_buffers"])
    assert seen == {warm}


def test_buffers_are_freed_with_their_tensors():
    mncore.wait_device_ops()
    gc.collect()  # earlier tests' garbage (cycles holding device tensors) is not freed inside the window
    base = mncore.metrics.counters()["live_buffers"]
    xs = [torch.ones(10).mncore() for _ in range(5)]
    assert mncore.metrics.counters()["live_buffers"] == base + 5
    del xs
    assert mncore.metrics.counters()["live_buffers"] == base


@pytest.mark.parametrize("device,policy", [("pfvm:cpu", "float"), ("mncore2:auto", "double")])
def test_live_bytes_count_each_result_as_stored(sim_env, device, policy):
    """A job's results enter the byte total at the size they are stored at: the traced size as a rule,
    the stored one where it differs (the simulator's double policy keeps float32 results in float64)."""
    from mncore.ir import buffers

    mncore.init(device, float_dtype=policy)
    x = torch.ones(64, 32).mncore()
    mncore.wait_device_ops()
    gc.collect()  # earlier tests' garbage (cycles holding device tensors) is not freed inside the window
    base = buffers.live_bytes()
    y, z = x * 2.0 + 1.0, x.sum(0)
    mncore.sync()
    mncore.wait_device_ops()
    stored = [buffers.get(t.mn_storage.value[0].bid) for t in (y, z)]
    assert [s.dtype for s in stored] == [torch.float64 if policy == "double" else torch.float32] * 2
    assert buffers.live_bytes() - base == sum(s.numel() * s.element_size() for s in stored)
    del y, z, stored
    assert buffers.live_bytes() == base


def test_reinit_switches_after_draining_pending_work():
    x = torch.arange(4.0).mncore() * 3
    mncore.init_cpu(execution="sync", implicit_sync="error")  # syncs and waits first
    assert x.tolist() == [0.0, 3.0, 6.0, 9.0]
    assert mncore.settings.execution == "sync"


def test_metrics_report_and_reset():
    (torch.ones(3).mncore() + 1).tolist()
    c = mncore.metrics.counters()
    for k in ("traced_ops", "graphs_executed", "compiles", "cache_hits", "implicit_syncs", "bytes_to_device",
              "bytes_to_host", "live_buffers", "trace_s", "compile_s", "execute_s"):
        assert k in c
    assert c["bytes_to_device"] >= 12 and c["bytes_to_host"] >= 12
    text = mncore.metrics.report()
    assert "traced_ops" in text and "ms" in text
    mncore.metrics.reset()
    assert mncore.metrics.counters()["traced_ops"] == 0


def test_chrome_trace_has_host_compile_and_device_lanes(tmp_path):
    mncore.profile.clear()
    step = _step_fn(*_setup(width=29))  # a width no other test uses: its graphs compile here, in the trace
    for _ in range(2):
        step()
    mncore.wait_device_ops()
    path = mncore.profile.export_chrome_trace(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    lane_of = {e["tid"]: e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M"}
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {"host", "compile", "device"} <= {lane_of.get(e["tid"]) for e in spans}
    assert all(e["dur"] >= 0 for e in spans)


def test_manual_seed_makes_random_ops_reproducible():
    torch.manual_seed(42)
    a = torch.randn(5, device="mncore")
    b = torch.rand(3).mncore().bernoulli()
    mncore.sync()
    torch.manual_seed(42)
    a2 = torch.randn(5, device="mncore")
    b2 = torch.rand(3).mncore().bernoulli()
    mncore.sync()
    assert torch.equal(a.cpu(), a2.cpu()) and torch.equal(b.cpu(), b2.cpu())
    assert not torch.equal(a.cpu(), torch.randn(5, device="mncore").cpu())


def test_kernel_result_that_contradicts_its_trace_fails_naming_the_op():
    """Found by `harness fuzz`: eager CPU accepts these mismatched shapes and returns [1, 1] where the
    op's shape rule (and the trace) says [1, 2]; mncore must not hand back a value of another shape."""
    grad, out = torch.randn(1, 1), torch.randn(1, 2)
    eager = torch.ops.aten._log_softmax_backward_data(grad, out, 1, torch.float32)
    assert list(eager.shape) == [1, 1]  # the inconsistency this test relies on
    lazy = torch.ops.aten._log_softmax_backward_data(grad.mncore(), out.mncore(), 1, torch.float32)
    assert list(lazy.shape) == [1, 2]
    mncore.sync()
    with pytest.raises(mncore.DeviceExecutionError, match=r"_log_softmax_backward_data.*returned \[1, 1\].*traced as \[1, 2\]"):
        mncore.wait_device_ops()


def test_batchnorm_eval_statistics_are_empty_as_in_eager():
    """CPU batch norm in eval mode returns empty save_mean/save_invstd; the trace says so too (meta says [C])."""
    x, w, b = torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    out = torch.ops.aten.native_batch_norm(x.mncore(), w.mncore(), b.mncore(), rm.mncore(), rv.mncore(), False, 0.1, 1e-5)
    ref = torch.ops.aten.native_batch_norm(x, w, b, rm, rv, False, 0.1, 1e-5)
    torch.testing.assert_close(out[0].cpu(), ref[0])
    assert [list(t.cpu().shape) for t in out[1:]] == [list(t.shape) for t in ref[1:]] == [[0], [0]]
