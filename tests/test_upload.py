"""``host_tensor.to('mncore')``: one upload (no traced op), with eager's values, strides and gradients."""
from __future__ import annotations

import pytest
import torch

import mncore
from tests.helpers import counter_delta


def _uploads(x: torch.Tensor, **kwargs) -> tuple[torch.Tensor, dict]:
    before = mncore.metrics.counters()
    y = x.to("mncore", **kwargs)
    return y, counter_delta(before, "traced_ops", "bytes_to_device")


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 5),
    lambda: torch.randn(5, 6).t(),  # a dense non-contiguous layout keeps its strides, as on CUDA
    lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
    lambda: torch.tensor(3.5),
    lambda: torch.arange(12, dtype=torch.int64).reshape(3, 4),
], ids=["contiguous", "transposed", "channels_last", "scalar", "int64"])
def test_dense_upload_traces_nothing_and_matches_eager(make) -> None:
    x = make()
    y, delta = _uploads(x)
    assert delta == {"traced_ops": 0, "bytes_to_device": x.numel() * x.element_size()}
    assert (y.shape, y.stride(), y.dtype, y.device.type) == (x.shape, x.stride(), x.dtype, "mncore")
    mncore.sync()
    assert torch.equal(y.cpu(), x)  # a copy: exact
    x.add_(1)  # the host tensor changing later does not change the device copy
    assert not torch.equal(y.cpu(), x)


@pytest.mark.parametrize("kwargs, x", [
    ({"dtype": torch.float16}, torch.randn(4, 3)),
    ({"memory_format": torch.channels_last}, torch.randn(2, 3, 4, 5)),
    ({}, torch.randn(4, 6)[:, ::2]),  # not dense: eager's preserve_format picks new strides
], ids=["dtype", "memory_format", "sliced"])
def test_converting_upload_keeps_eager_semantics(kwargs, x) -> None:
    y = x.to("mncore", **kwargs)
    ref = x.to("cpu", copy=True, **kwargs)
    assert (y.shape, y.stride(), y.dtype) == (ref.shape, ref.stride(), ref.dtype)
    mncore.sync()
    assert torch.equal(y.cpu(), ref)


def test_upload_of_a_leaf_that_requires_grad_carries_the_gradient_back() -> None:
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = x.to("mncore")
    assert y.requires_grad and type(y.grad_fn).__name__ == "ToCopyBackward0"
    (y * y).sum().backward()
    mncore.sync()
    torch.testing.assert_close(x.grad, 2 * x.detach())
    assert x.grad.device.type == "cpu"


def test_upload_refuses_a_second_device_index() -> None:
    with pytest.raises(ValueError, match="one device"):
        torch.randn(2).to("mncore:1")


def test_upload_of_a_sparse_tensor_names_the_layout_and_the_fix() -> None:
    with pytest.raises(mncore.errors.LayoutError, match=r"sparse_coo.*\.to_dense\(\)"):
        torch.randn(3, 3).to_sparse().to("mncore")


@pytest.mark.parametrize("make, traced", [
    (lambda: torch.randn(6, 5), 0),
    (lambda: torch.randn(5, 6).t(), 0),
    (lambda: torch.randn(4, 6)[:, ::2], 2),  # not dense: an empty tensor and a copy into it, as .to does
    (lambda: torch.arange(5), 0),
], ids=["contiguous", "transposed", "sliced", "int64"])
def test_tensor_mncore_method_is_the_same_upload_as_to(make, traced) -> None:
    """``.mncore()`` (the seed programs' spelling) takes a shorter path than ``.to('mncore')`` for plain
    host tensors; the result must not differ in anything a program can see."""
    x = make()
    before = mncore.metrics.counters()
    y = x.mncore()
    delta = counter_delta(before, "traced_ops")
    ref = x.to("mncore")
    assert (y.shape, y.stride(), y.dtype, y.device, y.requires_grad) == (
        ref.shape, ref.stride(), ref.dtype, ref.device, ref.requires_grad)
    assert delta["traced_ops"] == traced
    mncore.sync()
    assert torch.equal(y.cpu(), x)


def test_tensor_mncore_method_keeps_autograd_and_modes() -> None:
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = x.mncore()
    assert type(y.grad_fn).__name__ == "ToCopyBackward0"  # tracked: the generic route
    (y * 3).sum().backward()
    mncore.sync()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
    with torch.no_grad():
        assert x.mncore().grad_fn is None
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Watch():
        torch.randn(2).mncore()
    assert "mncore" in seen  # a torch function mode still sees the call, as with the generic method
    assert torch.randn(2).mncore(0).device.type == "mncore"
    with pytest.raises(ValueError, match="one device"):
        torch.randn(2).mncore(1)
