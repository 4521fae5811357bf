"""Stochastic-depth ResNet (Huang et al. 2016): CIFAR ResNet-110 whose residual blocks are dropped.

Block l of L survives with probability ``p_l = 1 - l / L * (1 - p_last)`` (linear decay,
p_last = 0.5 as in the paper). The drop pattern is drawn ONCE, when the workload is built, from
``random.Random(drop_seed)`` (config ``drop_seed``, default 0; independent of the weight seed, so
a tracer and an executor that seed weights differently still agree on the architecture). Every
traced and executed iteration of one workload drops the same blocks, so its trace is static and a
plan made on it stays valid (the DQN paper plans on such a network). A dropped block is skipped
(no compute, no memory); a dropped block that changes shape keeps its 1x1 projection shortcut
(the paper pads the identity with zeros instead). Surviving blocks are not rescaled in training.
"""

from __future__ import annotations

import random

from torch import nn

from ..errors import MemplanError
from .layers import init_weights
from .resnet import BasicBlock

STAGE_CHANNELS = (16, 32, 64)
# CIFAR ResNets have depth 6n+2: three stages of n two-conv blocks plus stem conv and classifier.
DEPTH_LAYERS_PER_BLOCK = 6
DEPTH_EXTRA_LAYERS = 2


def survival_pattern(n_blocks: int, p_last: float, seed: int) -> tuple[bool, ...]:
    """Which of `n_blocks` residual blocks survive, under linear-decay survival and `seed`."""
    rng = random.Random(seed)
    probs = [1 - (i + 1) / n_blocks * (1 - p_last) for i in range(n_blocks)]
    return tuple(rng.random() < p for p in probs)


class StochasticDepthResNet(nn.Module):
    """CIFAR ResNet of `depth` (6n+2) with a fixed set of dropped residual blocks.

    Attributes:
        survives: one bool per residual block, in forward order.
    """

    def __init__(self, depth: int, num_classes: int, p_last: float, seed: int):
        super().__init__()
        per_stage = (depth - DEPTH_EXTRA_LAYERS) // DEPTH_LAYERS_PER_BLOCK
        self.survives = survival_pattern(per_stage * len(STAGE_CHANNELS), p_last, seed)
        self.conv1 = nn.Conv2d(3, STAGE_CHANNELS[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(STAGE_CHANNELS[0])
        self.relu = nn.ReLU(inplace=True)
        blocks, cin = [], STAGE_CHANNELS[0]
        for i, width in enumerate(STAGE_CHANNELS):
            for j in range(per_stage):
                blocks.append(BasicBlock(cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width
        self.blocks = nn.ModuleList(blocks)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for block, alive in zip(self.blocks, self.survives):
            # A dropped block that changes shape (stride or width) keeps its projection shortcut.
            if alive:
                x = block(x)
            elif block.downsample is not None:
                x = block.downsample(x)
        return self.fc(self.avgpool(x).flatten(1))


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder: depth, num_classes, p_last and the drop seed come from `config`."""
    depth = config["depth"]
    blocks, rest = divmod(depth - DEPTH_EXTRA_LAYERS, DEPTH_LAYERS_PER_BLOCK)
    if blocks < 1 or rest:
        raise MemplanError(f"stochastic_depth: depth must be 6n+2 (8, 20, 56, 110, ...), got {depth}")
    return StochasticDepthResNet(depth, config["num_classes"], config["p_last"], config["drop_seed"])
