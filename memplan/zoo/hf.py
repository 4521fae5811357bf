"""Hugging Face `transformers` models, ``hf:<name>``, built from config classes with random init.

Nothing is ever downloaded: models are built as ``ModelClass(ConfigClass(**fields))`` (never
``from_pretrained``), and ``HF_HUB_OFFLINE=1`` is set before transformers is imported. Attention
is the eager implementation, which traces under fake tensors. Config keys override fields of the
transformers config (``n_layer=2``), plus ``seq_len`` for text models; images use ``input_size``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import MemplanError, unknown_name
from .config import coerce
from .workload import ADAM_LR, SGD_LR, ModelSpec

log = logging.getLogger(__name__)

PREFIX = "hf:"
DEFAULT_SEQ_LEN = 128
IMAGENET_SIZE = 224
IMAGENET_CLASSES = 1000
ATTENTION = "eager"
CAUSAL_LM_LOSS = "ForCausalLM"  # transformers' loss mapping key for next-token prediction
# Config keys that belong to the workload, not to the transformers config.
WORKLOAD_KEYS = ("seq_len", "lr", "optimizer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HFPreset:
    """One named transformers model: its config and model classes, field overrides, task."""

    config_class: str                 # transformers config class name
    model_class: str                  # transformers model class name
    task: str                         # "mlm", "clm" or "image"
    fields: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # config field overrides
    summary: str = ""                 # one line for listings
    optimizer: str = "adam"           # Adam for transformers (and ConvNeXt, as its paper); SGD for ResNet


_IMAGE_FIELDS = {"num_labels": IMAGENET_CLASSES}
PRESETS = {
    "bert-base": HFPreset(config_class="BertConfig", model_class="BertForMaskedLM", task="mlm",
                          summary="BERT-base (110M) masked LM"),
    "bert-large": HFPreset(config_class="BertConfig", model_class="BertForMaskedLM", task="mlm",
                           fields={"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                   "intermediate_size": 4096}, summary="BERT-large (335M) masked LM"),
    "gpt2": HFPreset(config_class="GPT2Config", model_class="GPT2LMHeadModel", task="clm",
                     summary="GPT-2 small (124M) causal LM"),
    "gpt2-medium": HFPreset(config_class="GPT2Config", model_class="GPT2LMHeadModel", task="clm",
                            fields={"n_embd": 1024, "n_layer": 24, "n_head": 16},
                            summary="GPT-2 medium (355M) causal LM"),
    "gpt2-large": HFPreset(config_class="GPT2Config", model_class="GPT2LMHeadModel", task="clm",
                           fields={"n_embd": 1280, "n_layer": 36, "n_head": 20},
                           summary="GPT-2 large (774M) causal LM"),
    # Llama 2 7B's shape (Touvron et al. 2023, table 1 / its config.json); built from the config only.
    "llama-7b": HFPreset(config_class="LlamaConfig", model_class="LlamaForCausalLM", task="clm",
                         fields={"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                                 "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
                                 "max_position_embeddings": 4096},
                         summary="Llama-style 7B (6.7B) causal LM, config only"),
    "vit-base": HFPreset(config_class="ViTConfig", model_class="ViTForImageClassification", task="image",
                         fields=_IMAGE_FIELDS, summary="ViT-B/16 (86M), 224x224, 1000 classes"),
    "convnext-tiny": HFPreset(config_class="ConvNextConfig", model_class="ConvNextForImageClassification",
                              task="image", fields=_IMAGE_FIELDS, summary="ConvNeXt-T (28.6M), 224x224"),
    "resnet-50": HFPreset(config_class="ResNetConfig", model_class="ResNetForImageClassification",
                          task="image", fields=_IMAGE_FIELDS, summary="HF ResNet-50 (25.6M), 224x224",
                          optimizer="sgd"),
}


def known() -> list[str]:
    """The ``hf:`` names."""
    return [PREFIX + name for name in PRESETS]


def _transformers():
    # Defensive: even a stray hub lookup must fail fast instead of downloading.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers  # optional (memplan[hf]), and slow to import: only hf:<name> models need it
    except ImportError as exc:
        raise MemplanError(f"hf: models need the transformers package (pip install 'memplan[hf]'): {exc}")
    return transformers


def spec(name: str, overrides: Mapping[str, Any]) -> ModelSpec:
    """The ModelSpec of ``hf:<name>``, its defaults holding every config field it will set.

    Args:
        name: the full name, ``hf:<preset>``.
        overrides: caller config: transformers config fields, ``seq_len``, ``lr``, ``optimizer``.

    Returns:
        A ModelSpec; its defaults are the preset's and the caller's fields, the vocabulary size
        (text) or label count (images), and ``seq_len`` for text.

    Raises:
        UnknownNameError: an unknown preset; MemplanError: a key the config class does not have.
    """
    preset = PRESETS.get(name[len(PREFIX):])
    if preset is None:
        raise unknown_name("model", name, known())
    transformers = _transformers()
    config_class = getattr(transformers, preset.config_class)
    base = config_class(**preset.fields)
    fields = {k: v for k, v in overrides.items() if k not in WORKLOAD_KEYS}
    unknown = sorted(k for k in fields if not hasattr(base, k))
    if preset.task == "image" and "seq_len" in overrides:
        unknown.append("seq_len")
    if unknown:
        raise MemplanError(f"model {name}: unknown config key(s) {', '.join(unknown)} "
                           f"(not fields of transformers.{preset.config_class})")
    fields = {**preset.fields, **{k: coerce(name, k, v, getattr(base, k)) for k, v in fields.items()}}
    try:
        with _quiet_config_warnings():
            probe = config_class(**fields)
    except (TypeError, ValueError) as exc:  # transformers validates fields (strict dataclasses)
        raise MemplanError(f"model {name}: bad config: {str(exc).splitlines()[0]}") from exc
    if preset.task == "image":
        defaults = {**fields, "num_labels": probe.num_labels}
    else:
        defaults = {**fields, "vocab_size": probe.vocab_size, "seq_len": DEFAULT_SEQ_LEN}
    return ModelSpec(name=name, summary=preset.summary, build=_builder(transformers, preset, name),
                     make_inputs=_inputs(preset.task), loss=_loss(preset.task), defaults=defaults,
                     input_size=IMAGENET_SIZE if preset.task == "image" else None, optimizer=preset.optimizer,
                     lr=ADAM_LR if preset.optimizer == "adam" else SGD_LR)


def _builder(transformers, preset: HFPreset, name: str):
    config_class = getattr(transformers, preset.config_class)
    model_class = getattr(transformers, preset.model_class)

    def build(config: dict, input_size: int | None) -> nn.Module:
        with _quiet_config_warnings():
            hf_config = config_class(**{k: v for k, v in config.items() if k != "seq_len"})
        if preset.task != "image":
            _check_positions(name, hf_config, config["seq_len"])
        hf_config._attn_implementation = ATTENTION
        if preset.task == "image":
            hf_config.problem_type = "single_label_classification"  # no data-dependent guess at step 1
            if hasattr(hf_config, "image_size"):
                hf_config.image_size = input_size
        with _quiet_config_warnings():
            model = model_class(hf_config)
        model.config.use_cache = False  # training: no key/value cache
        if preset.task == "clm" and getattr(model, "loss_type", None) is None:
            # What transformers falls back to anyway, named so it does not warn about it.
            model.loss_type = CAUSAL_LM_LOSS
        return model

    return build


@contextlib.contextmanager
def _quiet_config_warnings():
    """transformers' warnings about a configuration (token ids outside a small vocabulary, say)
    kept off stderr unless memplan logs at INFO (`-v`): the models are randomly initialised, and
    what a user gets wrong is one error line, not a warning before it."""
    logger = logging.getLogger("transformers")
    level = logger.level
    if not log.isEnabledFor(logging.INFO):
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_positions(name: str, hf_config, seq_len: int) -> None:
    """Refuse a sequence longer than the model has positions for (its position table would be
    indexed past its end when the step runs, and a fake trace would record a step that cannot)."""
    positions = getattr(hf_config, "max_position_embeddings", None)
    if positions is not None and seq_len > positions:
        field = type(hf_config).attribute_map.get("max_position_embeddings", "max_position_embeddings")
        raise MemplanError(f"model {name}: config seq_len={seq_len} is more than its {positions} "
                           f"positions; lower seq_len or raise {field}")


def _inputs(task: str):
    def make(batch: int, config: dict, input_size: int | None) -> tuple:
        if task == "image":
            return (torch.randn(batch, 3, input_size, input_size),
                    torch.randint(0, config["num_labels"], (batch,)))
        ids = torch.randint(0, config["vocab_size"], (batch, config["seq_len"]))
        if task == "clm":
            return ids, ids.clone()  # the model shifts labels itself
        return ids, torch.randint(0, config["vocab_size"], ids.shape)

    return make


def _loss(task: str):
    def loss(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if task == "image":
            return model(pixel_values=x, labels=labels).loss
        if task == "clm":
            # An explicit all-ones mask: without one, transformers looks for packed sequences in the
            # position ids, a data-dependent branch that real tensors take and fake ones cannot.
            return model(input_ids=x, attention_mask=torch.ones_like(x), labels=labels).loss
        return model(input_ids=x, labels=labels).loss

    return loss
