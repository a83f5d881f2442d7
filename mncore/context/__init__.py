"""``mncore.context``: the MLSDK-style Context API (port existing code by changing its import)."""
from mncore.context import storage
from mncore.context.api import CompiledFunction, Context, MNDevice, TensorProxy
from mncore.errors import InputError
from mncore.context.naming import (
    get_tensor_name, set_buffer_name_in_optimizer, set_tensor_name, set_tensor_name_in_module,
)
from mncore.context.optim import MNCoreAdam, MNCoreAdamW, MNCoreOptimizer, MNCoreSGD, prepare_for_compile
from mncore.context.storage import CacheOptions

TensorLike = object  # Union[torch.Tensor, TensorProxy] in MLSDK; kept for type-hint compatibility

__all__ = [
    "CacheOptions", "CompiledFunction", "Context", "InputError", "MNDevice", "MNCoreAdam", "MNCoreAdamW",
    "MNCoreOptimizer", "MNCoreSGD", "TensorLike", "TensorProxy", "get_tensor_name", "set_buffer_name_in_optimizer",
    "prepare_for_compile", "set_tensor_name", "set_tensor_name_in_module", "storage",
]
