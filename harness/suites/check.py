"""One sample checked on a backend against eager CPU: forward outputs, then input (and parameter)
gradients, judged by ``harness.compare.compare`` with its default tolerances.

A float mismatch counts only if a float64 run says it is not noise (``harness.fuzz.oracles.is_noise``:
mncore's RMSE against float64 at most twice eager float32's), as the fuzzer rules. Ops whose output is
random (eager runs an aten op tagged ``nondeterministic_seeded``) compare metadata only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from harness.compare import compare
from harness.fuzz.oracles import drained, is_noise

# make(device, double) -> (thunk running the forward, leaves to differentiate): builds fresh inputs each call.
Make = Callable[[str, bool], tuple[Callable[[], Any], list[torch.Tensor]]]


@dataclass
class Outcome:
    """How one sample went: ``stage`` is where it failed (``forward``/``backward``), ``error`` whether by an
    exception; ``noise``: passed only by the float64 rule; ``backward``: pass, or n/a with why."""

    ok: bool
    stage: str = ""
    message: str = ""
    error: bool = False
    noise: bool = False
    backward: str = "n/a"


def to_host(x: Any) -> Any:
    """Every tensor of a nested result on the CPU (named tuples and return types kept)."""
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, x)


def fresh(x: Any, device: str, double: bool = False) -> Any:
    """New leaf copies of every tensor on ``device`` (layout and ``requires_grad`` kept); ``device=`` values
    say ``device``; ``double``: float32 tensors become float64 (the noise reference)."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = v.detach()
            if double and t.dtype == torch.float32:
                t = t.double()
            t = t.clone() if device == "cpu" else t.to(device)
            return t.requires_grad_(v.requires_grad) if v.requires_grad and (t.is_floating_point() or t.is_complex()) else t
        if isinstance(v, torch.device):
            return torch.device(device)
        return v
    return tree_map(one, x)


def grad_leaves(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(x) if isinstance(t, torch.Tensor) and t.requires_grad]


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _weights(outs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Fixed random output weights (drawn in double on the CPU, so every run uses the same)."""
    g = torch.Generator().manual_seed(1234)
    ws = []
    for o in outs:
        dt = torch.complex128 if o.is_complex() else torch.float64
        ws.append(torch.randn(o.shape, generator=g, dtype=dt).to(o.dtype).to(o.device))  # .to('cpu') outputs stay
    return ws


def _grads(thunk: Callable[[], Any], leaves: list[torch.Tensor],
           process: Callable[[Any], Any]) -> list[torch.Tensor | None] | None:
    outs = _differentiable(process(thunk()))
    if not outs or not leaves:
        return None
    return list(torch.autograd.grad(outs, leaves, _weights(outs), allow_unused=True))


class _SeededOps(TorchDispatchMode):
    """Notes whether any aten op tagged ``nondeterministic_seeded`` ran (OpInfo wraps random ops in a
    fixed seed, so two eager runs agree while mncore's own random stream differs)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and not _draws_nothing(func, args, kwargs):
            self.seen = True
        return func(*args, **kwargs)


def _draws_nothing(func: Any, args: tuple, kwargs: dict) -> bool:
    """A seeded op that draws no random numbers this call: dropout probability 0 or not training
    (attention kernels are tagged for their optional dropout)."""
    named = {a.name: (args[i] if i < len(args) else kwargs.get(a.name, a.default_value if a.has_default_value() else None))
             for i, a in enumerate(func._schema.arguments)}
    return named.get("dropout_p", named.get("p")) == 0 or named.get("train") is False


def eager_forward(make: Make) -> tuple[Any, bool]:
    """The eager CPU forward of a sample (seed 0) and whether its output is random."""
    torch.manual_seed(0)
    thunk, _ = make("cpu", False)
    mode = _SeededOps()
    with torch.no_grad(), mode:
        out = thunk()
    return out, mode.seen


def check(make: Make, device: str, *, backward: bool, process: Callable[[Any], Any] = lambda o: o,
          meta_only: bool = False) -> Outcome:
    """Forward (and, with ``backward``, gradients) of one sample on ``device`` vs eager CPU; ``meta_only``:
    the output is uninitialised memory (``empty_like``), so only its metadata can agree."""
    want, random = eager_forward(make)
    random = random or meta_only
    torch.manual_seed(0)
    try:
        with drained():
            thunk, _ = make(device, False)
            with torch.no_grad():
                got = to_host(thunk())
    except Exception as e:  # noqa: BLE001 - the verdict
        return Outcome(False, "forward", _error(e), error=True)
    v = compare(got, to_host(want), meta_only=random)
    noise = False
    if not v:
        if not is_noise(got, to_host(want), lambda: _double_forward(make)):
            return Outcome(False, "forward", v.message)
        noise = True
    if not backward:
        return Outcome(True, noise=noise)
    if random:
        return Outcome(True, noise=noise, backward="n/a: random op")
    torch.manual_seed(0)
    try:
        thunk, leaves = make("cpu", False)
        want_g = _grads(thunk, leaves, process)
    except Exception as e:  # noqa: BLE001 - no eager derivative: no reference
        return Outcome(True, noise=noise, backward=f"n/a: eager backward raises {type(e).__name__}")
    if want_g is None:
        return Outcome(True, noise=noise, backward="n/a: no differentiable output")
    torch.manual_seed(0)
    try:
        with drained():
            thunk, leaves = make(device, False)
            got_g = to_host(_grads(thunk, leaves, process))
    except Exception as e:  # noqa: BLE001
        return Outcome(False, "backward", _error(e), error=True, noise=noise)
    v = compare(got_g, want_g, path="grad")
    if not v:
        def reference() -> Any:
            torch.manual_seed(0)
            t, ls = make("cpu", True)
            return _grads(t, ls, process)
        if not is_noise(got_g, want_g, reference):
            return Outcome(False, "backward", v.message, noise=noise)
        noise = True
    return Outcome(True, noise=noise, backward="pass")


def _double_forward(make: Make) -> Any:
    torch.manual_seed(0)
    thunk, _ = make("cpu", True)
    with torch.no_grad():
        return thunk()


def _error(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"
