"""Standard inputs and losses: image classification, segmentation, next-token prediction."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

IMAGE_CHANNELS = 3


def image_inputs(batch: int, config: dict, input_size: int) -> tuple:
    """Random images ``(batch, 3, S, S)`` and class labels in ``[0, num_classes)``."""
    images = torch.randn(batch, config.get("in_channels", IMAGE_CHANNELS), input_size, input_size)
    return images, torch.randint(0, config["num_classes"], (batch,))


def segmentation_inputs(batch: int, config: dict, input_size: int) -> tuple:
    """Random images and a per-pixel class mask ``(batch, S, S)``."""
    images = torch.randn(batch, config["in_channels"], input_size, input_size)
    return images, torch.randint(0, config["num_classes"], (batch, input_size, input_size))


def token_inputs(batch: int, config: dict, input_size: int | None) -> tuple:
    """Random token ids ``(batch, seq_len)`` and next-token targets of the same shape."""
    shape = (batch, config["seq_len"])
    return torch.randint(0, config["vocab_size"], shape), torch.randint(0, config["vocab_size"], shape)


def classify_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits; also right for per-pixel logits ``(N, C, H, W)``."""
    return F.cross_entropy(model(images), labels)


def sequence_loss(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits ``(N, T, V)``."""
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def self_loss(model: nn.Module, *inputs) -> torch.Tensor:
    """For models whose forward returns their own loss (k-means)."""
    return model(*inputs)
