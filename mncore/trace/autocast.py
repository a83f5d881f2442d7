"""``torch.autocast("mncore", dtype=torch.bfloat16 | torch.float16)``.

PyTorch's autocast runs a per-device dispatch key; a backend says which ops it casts. mncore follows
CUDA's lists in short: matrix products and convolutions run in the autocast dtype, reductions and
normalisations that lose accuracy in half precision run in float32, and every other op falls through
unchanged. The traced graph then holds the casts, so the pfvm devices run the lower-precision kernels.
"""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten
_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_LOWER = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d", "convolution",
          "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "_scaled_dot_product_attention_math",
          "scaled_dot_product_attention", "addbmm", "prelu", "chain_matmul", "linalg_vecdot")
_FLOAT32 = ("softmax", "log_softmax", "layer_norm", "group_norm", "cross_entropy_loss", "nll_loss", "mse_loss",
            "binary_cross_entropy_with_logits", "sum", "prod", "cumsum", "cumprod", "norm", "exp", "log", "pow",
            "logsumexp", "cosine_similarity", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss")


# Composites cast as a whole (as CUDA does), so that their parts see one dtype.
_CAST_BEFORE_DECOMPOSING = ("linear", "matmul", "scaled_dot_product_attention", "softmax", "log_softmax",
                            "layer_norm", "group_norm", "cross_entropy_loss")


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _kernel(op: Any, to_float32: bool):
    def run(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype("mncore")
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})
    return run


def register(lib: torch.library.Library, fallback_lib: torch.library.Library) -> None:
    """Install the fallthrough for every op and the casting kernels of the two lists."""
    fallback_lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    for names, to_float32 in ((_LOWER, False), (_FLOAT32, True)):
        for name in names:
            packet = getattr(aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                try:  # TorchScript-only overloads (sum.int) have no dispatcher entry
                    composite = torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")
                except RuntimeError:
                    continue
                if overload.endswith("out") or (composite and name not in _CAST_BEFORE_DECOMPOSING):
                    continue  # out= forms keep their dtype; other composites decompose into listed ops
                schema = op._schema
                qualified = schema.name.split("::")[1] + (f".{schema.overload_name}" if schema.overload_name else "")
                lib.impl(qualified, _kernel(op, to_float32), "AutocastPrivateUse1")
