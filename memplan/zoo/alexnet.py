"""AlexNet (Krizhevsky et al. 2012), single-tower form as in torchvision / the One-weird-trick paper."""

from __future__ import annotations

from torch import nn

from .layers import init_weights

POOLED_SIDE = 6
HIDDEN = 4096  # classifier width (config classifier_width; smaller only for quick tests)
DROPOUT = 0.5


class AlexNet(nn.Module):
    """Five convs (11x11/4, 5x5, 3x3 x3) with three max-pools, adaptive 6x6 pool, 4096-4096 classifier."""

    def __init__(self, num_classes: int, width: int = HIDDEN):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d(POOLED_SIDE)
        self.classifier = nn.Sequential(
            nn.Dropout(DROPOUT), nn.Linear(256 * POOLED_SIDE ** 2, width), nn.ReLU(inplace=True),
            nn.Dropout(DROPOUT), nn.Linear(width, width), nn.ReLU(inplace=True),
            nn.Linear(width, num_classes))
        init_weights(self)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder for AlexNet."""
    return AlexNet(config["num_classes"], config["classifier_width"])
