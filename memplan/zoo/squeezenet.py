"""SqueezeNet 1.1 (Iandola et al. 2016; the 1.1 variant: 3x3/64 stem, earlier pools)."""

from __future__ import annotations

import torch
from torch import nn

# (squeeze, expand) channels of each Fire module; "M" is a 3x3/2 max-pool (ceil mode).
POOL = "M"
FIRES = (POOL, (16, 64), (16, 64), POOL, (32, 128), (32, 128), POOL, (48, 192), (48, 192), (64, 256),
         (64, 256))
STEM = 64
DROPOUT = 0.5
# Final-conv init std from the reference implementation (the classifier is a conv).
FINAL_CONV_STD = 0.01


class Fire(nn.Module):
    """1x1 squeeze, then parallel 1x1 and 3x3 expands concatenated."""

    def __init__(self, cin: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1x1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(inplace=True))
        self.expand3x3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x):
        x = self.squeeze(x)
        return torch.cat([self.expand1x1(x), self.expand3x3(x)], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1: conv stem, eight Fire modules, dropout, 1x1 conv classifier, global pool."""

    def __init__(self, num_classes: int):
        super().__init__()
        layers, cin = [nn.Conv2d(3, STEM, 3, 2), nn.ReLU(inplace=True)], STEM
        for item in FIRES:
            if item == POOL:
                layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
                continue
            layers.append(Fire(cin, *item))
            cin = 2 * item[1]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(DROPOUT), nn.Conv2d(cin, num_classes, 1),
                                        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.classifier[1].weight, 0, FINAL_CONV_STD)

    def forward(self, x):
        return self.classifier(self.features(x)).flatten(1)


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder for SqueezeNet 1.1."""
    return SqueezeNet(config["num_classes"])
