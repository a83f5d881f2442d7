"""Tensor names for the Context API registry (MLSDK's ``set_tensor_name*`` helpers).

A name is stored in the tensor's ``__dict__`` (not in a weak map) so that it travels with the
object through ``torch.utils.swap_tensors``, which the Context API uses while tracing.
"""
from __future__ import annotations

import torch

_ATTR = "_mncore_name"


def set_tensor_name(tensor: torch.Tensor, name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a tensor name must be a non-empty string, got {name!r}")
    tensor.__dict__[_ATTR] = name


def get_tensor_name(tensor: torch.Tensor) -> str | None:
    return tensor.__dict__.get(_ATTR)


def set_tensor_name_in_module(module: torch.nn.Module, prefix: str) -> None:
    """Name every parameter and buffer ``<prefix>.<qualified name>``."""
    for n, p in module.named_parameters(remove_duplicate=True):
        set_tensor_name(p, f"{prefix}.{n}")
    for n, b in module.named_buffers(remove_duplicate=True):
        set_tensor_name(b, f"{prefix}.{n}")


def set_buffer_name_in_optimizer(optimizer: torch.optim.Optimizer, prefix: str) -> None:
    """Name every state tensor ``<prefix>.<param index>.<state key>`` (param order of param_groups)."""
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    set_tensor_name(value, f"{prefix}.{index}.{key}")
            index += 1
