"""Catalog candidates from transformers' own registries: every model type with a task head.

Each model type (``CONFIG_MAPPING_NAMES``) is tried with the first task head it has in ``TASKS``
(seq2seq before masked LM before causal LM, so that an encoder-decoder is trained as one and an
encoder as an encoder, not through the decoder head some encoders also have; contrastive image-text
models, depth, QA, time series, backbones and bare encoders come after every head the first catalog
had, so that no model type it held changed its head); its default
config is shrunk generically (``shrink``) and the head built from it with random weights. Batches
follow the model class's ``main_input_name`` (token ids, pixels, audio samples, audio features) and
carry the task's labels so that the library's own loss is trained; a head without a loss is trained
on the mean square of its first output.
"""
from __future__ import annotations

import copy
from functools import lru_cache, partial
from typing import Any

import torch

from model_zoo.catalog.shrink import SEQ, shrink
from model_zoo.spec import ModelSpec

# (task, transformers' mapping of model type -> head class), in the order a model type picks its task
TASKS = (
    ("speech-seq2seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("seq2seq-lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("masked-lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("causal-lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("sequence-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("ctc", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ("audio-classification", "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES"),
    ("semantic-segmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES"),
    ("video-classification", "MODEL_FOR_VIDEO_CLASSIFICATION_MAPPING_NAMES"),
    ("zero-shot-image-classification", "MODEL_FOR_ZERO_SHOT_IMAGE_CLASSIFICATION_MAPPING_NAMES"),  # contrastive
    ("depth-estimation", "MODEL_FOR_DEPTH_ESTIMATION_MAPPING_NAMES"),
    ("image-to-image", "MODEL_FOR_IMAGE_TO_IMAGE_MAPPING_NAMES"),
    ("question-answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ("token-classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("time-series-regression", "MODEL_FOR_TIME_SERIES_REGRESSION_MAPPING_NAMES"),
    # heads without a loss of their own (trained on the mean square of their first output)
    ("backbone", "MODEL_FOR_BACKBONE_MAPPING_NAMES"),
    ("image-features", "MODEL_FOR_IMAGE_MAPPING_NAMES"),
    ("text-encoding", "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES"),
)
PREFIX = "hf_"
AUDIO_SAMPLES = 8000  # 0.5 s at 16 kHz: 24 frames after wav2vec2-style feature encoders (stride 320), more
# than their time masks span


@lru_cache(maxsize=1)
def candidates() -> dict[str, tuple[str, str, str]]:
    """Catalog name -> (model type, task, head class name), for every model type with a head in TASKS."""
    from transformers.models.auto import configuration_auto, modeling_auto

    out: dict[str, tuple[str, str, str]] = {}
    for model_type in sorted(configuration_auto.CONFIG_MAPPING_NAMES):
        for task, mapping in TASKS:
            arch = getattr(modeling_auto, mapping).get(model_type)
            if arch:
                out[PREFIX + model_type.replace("-", "_")] = (model_type, task, arch if isinstance(arch, str) else arch[0])
                break
    return out


@lru_cache(maxsize=None)
def tiny_config(model_type: str) -> Any:
    """The model type's default config, shrunk (sub-configs too); eager attention, so that every model
    computes attention the same way (and the mask code reads no values on the host where it can)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    config = type(default).from_dict(shrink(default.to_dict()))
    for c in (config, *(getattr(config, k) for k in getattr(config, "sub_configs", {}) if getattr(config, k, None))):
        c._attn_implementation = "eager"
    if getattr(config, "pad_token_id", None) is None and hasattr(config, "vocab_size"):
        config.pad_token_id = 0  # sequence-classification heads find each row's last token by padding
    return config


def build(model_type: str, task: str, arch: str) -> torch.nn.Module:
    """A new model with a config of its own: models keep their config and read it while running (and the
    harness switches randomness in it off), so a shared one would carry one model's changes into the next
    build and into the batches made from it."""
    import transformers

    cls = getattr(transformers, arch, None)
    if cls is None:
        raise LookupError(f"transformers {transformers.__version__} has no class {arch}")
    return cls(copy.deepcopy(tiny_config(model_type)))


def _get(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` the config (or its text/vision/audio/encoder sub-config) sets."""
    for c in (config, *(getattr(config, k, None) for k in ("text_config", "vision_config", "audio_config",
                                                             "encoder", "decoder"))):
        for n in names:
            v = getattr(c, n, None) if c is not None else None
            if v is not None:
                return v
    return default


def _size(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _pixels(config: Any, task: str, n: int, g: torch.Generator) -> torch.Tensor:
    """Images (or, for video classification, clips) of the config's size and channels."""
    h, w = _size(_get(config, "image_size", default=32))
    shape = (n, int(_get(config, "num_channels", default=3)), h, w)
    frames = _get(config, "num_frames")
    if task == "video-classification" and frames:
        shape = (n, int(frames), *shape[1:])
    return torch.randn(shape, generator=g)


def batch(cfg: dict, n: int, g: torch.Generator) -> dict:
    """Inputs by the head's main input name, with the task's labels."""
    import transformers

    config = tiny_config(cfg["model_type"])
    task, main = cfg["task"], getattr(getattr(transformers, cfg["arch"]), "main_input_name", "input_ids")
    vocab = int(_get(config, "vocab_size", default=256))
    labels = int(getattr(config, "num_labels", 2))
    b: dict[str, torch.Tensor] = {}
    if main == "input_ids":
        ids = torch.randint(3, vocab, (n, SEQ), generator=g)
        b = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if task == "seq2seq-lm":
            b["decoder_input_ids"] = ids
        if task == "zero-shot-image-classification":  # an image per text, trained on the contrastive loss
            b["pixel_values"] = _pixels(config, task, n, g)
    elif main == "pixel_values":
        b = {"pixel_values": _pixels(config, task, n, g)}
    elif main == "past_values":
        context, channels = int(_get(config, "context_length", default=32)), int(_get(config, "num_input_channels", default=1))
        b = {"past_values": torch.randn(n, context, channels, generator=g)}
    elif main == "input_values":
        b = {"input_values": torch.randn(n, AUDIO_SAMPLES, generator=g)}
    elif main == "input_features":
        mel = int(_get(config, "num_mel_bins", "feature_size", "input_feat_per_channel", default=80))
        frames = 2 * int(_get(config, "max_source_positions", default=32))
        whisper_like = hasattr(config, "num_mel_bins")
        b = {"input_features": torch.randn((n, mel, frames) if whisper_like else (n, frames, mel), generator=g)}
    else:
        raise ValueError(f"{cfg['arch']}: main input {main!r} has no batch recipe")
    if task in ("causal-lm", "masked-lm"):
        b["labels"] = b["input_ids"]
    elif task in ("seq2seq-lm", "speech-seq2seq"):
        b["labels"] = torch.randint(3, vocab, (n, SEQ), generator=g)
    elif task in ("sequence-classification", "image-classification", "audio-classification", "video-classification"):
        b["labels"] = torch.randint(0, labels, (n,), generator=g)
    elif task == "token-classification":
        b["labels"] = torch.randint(0, labels, (n, SEQ), generator=g)
    elif task == "question-answering":
        b["start_positions"], b["end_positions"] = torch.randint(0, SEQ, (2, n), generator=g)
    elif task == "time-series-regression":
        b["target_values"] = torch.randn(n, int(_get(config, "num_targets", default=1)), generator=g)
    elif task == "ctc":
        b["labels"] = torch.randint(3, vocab, (n, 2), generator=g)
    elif task == "semantic-segmentation":
        h, w = b["pixel_values"].shape[-2:]
        b["labels"] = torch.randint(0, labels, (n, h, w), generator=g)
    return b


def first_float(out: Any) -> torch.Tensor:
    """The first floating-point tensor of a model output (a tensor, a tuple/list/dict or a ModelOutput)."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point():
            return out
        raise ValueError("the model output is not floating point")
    values = out.values() if isinstance(out, dict) else out
    for v in values:
        if isinstance(v, (torch.Tensor, list, tuple, dict)):
            try:
                return first_float(v)
            except ValueError:
                continue
    raise ValueError("the model output holds no floating-point tensor")


def loss(model: torch.nn.Module, b: dict, **options: Any) -> torch.Tensor:
    """The head's own loss (``options`` such as ``return_loss=True`` ask for it), else the mean square of
    its first output, in float32 at least: a half-precision output is widened, a float64 one (the golden
    reference's) kept, or the reference's loss would carry float32's rounding."""
    out = model(**b, **options)
    got = getattr(out, "loss", None)
    if got is not None:
        return got
    first = first_float(out)
    return first.to(torch.promote_types(first.dtype, torch.float32)).pow(2).mean()


def spec(name: str) -> ModelSpec:
    model_type, task, arch = candidates()[name]
    return ModelSpec(
        name=name, family=model_type, traits={"task": task},
        configs={"tiny": {"model_type": model_type, "task": task, "arch": arch}}, batch_sizes={"tiny": 2},
        build_fn=build, batch_fn=batch,
        loss_fn=partial(loss, return_loss=True) if task == "zero-shot-image-classification" else loss,
        optimizer_fn=lambda params: torch.optim.AdamW(params, lr=1e-4),
        notes=f"transformers {arch}, default config shrunk (model_zoo/catalog/shrink.py), random weights",
        tags=("catalog", "transformers"),
    )
