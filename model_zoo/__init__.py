"""The model zoo: specs of representative models, selected by architectural traits."""
from model_zoo.registry import all_specs, get, names
from model_zoo.spec import TRAIT_KEYS, Batch, ModelSpec, batch_to, train_step

__all__ = ["TRAIT_KEYS", "Batch", "ModelSpec", "all_specs", "batch_to", "get", "names", "train_step"]
