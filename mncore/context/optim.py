"""torch.optim-compatible optimizers whose state exists (and can be named) before compiling.

Plain ``torch.optim`` optimizers create their state lazily inside the first ``step()``, which a
compiled step would bake in as "first step" behaviour. These allocate it at construction, and
the Adam family keeps ``step`` as a device tensor (``capturable=True``) so that no value has to
be read on the host inside the compiled function.
"""
from __future__ import annotations

from typing import Any

import torch


class MNCoreOptimizer:
    """Mixin: allocate every state tensor eagerly."""

    def _init_state(self) -> None:
        raise NotImplementedError


def prepare_for_compile(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Make a plain torch.optim SGD/Adam/AdamW compile-ready in place: allocate its state, capturable Adam.

    The update is the same maths as the optimizer's own first step (SGD's zero momentum buffer
    gives buf = grad when dampening is 0; Adam's state starts at zero either way). Other optimizer
    classes raise: their lazily created state cannot be registered before compiling.
    """
    if isinstance(optimizer, MNCoreOptimizer):
        return optimizer
    if isinstance(optimizer, torch.optim.SGD):
        if any(g["momentum"] and g["dampening"] for g in optimizer.param_groups):
            raise ValueError("prepare_for_compile: SGD with dampening != 0 would differ on its first step")
        MNCoreSGD._init_state(optimizer)  # type: ignore[arg-type]
        return optimizer
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        for group in optimizer.param_groups:
            group["capturable"] = True
        _AdamState._init_state(optimizer)  # type: ignore[arg-type]
        return optimizer
    raise TypeError(f"prepare_for_compile supports SGD, Adam and AdamW, not {type(optimizer).__name__}")


class MNCoreSGD(torch.optim.SGD, MNCoreOptimizer):
    """SGD with the momentum buffer allocated as zeros (the first update equals torch's when dampening=0)."""

    def __init__(self, params: Any, lr: float = 1e-3, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, **kwargs: Any):
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov, **kwargs)
        self._init_state()

    def _init_state(self) -> None:
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    self.state[p].setdefault("momentum_buffer", torch.zeros_like(p, memory_format=torch.preserve_format))


class _AdamState(MNCoreOptimizer):
    def _init_state(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                if st:
                    continue
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


class MNCoreAdam(torch.optim.Adam, _AdamState):
    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, **kwargs: Any):
        kwargs["capturable"] = True
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)
        self._init_state()


class MNCoreAdamW(torch.optim.AdamW, _AdamState):
    def __init__(self, params: Any, lr: float = 1e-3, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, **kwargs: Any):
        kwargs["capturable"] = True
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kwargs)
        self._init_state()
