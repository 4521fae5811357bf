"""VGG-11/13/16/19 (Simonyan & Zisserman 2014), ImageNet and CIFAR-10 forms.

ImageNet form: the published network without BatchNorm (vgg16: 138.4M parameters): conv stack,
adaptive 7x7 average pool, 4096-4096-classes classifier with dropout (config
``classifier_width`` shrinks the 4096 for quick tests). CIFAR-10 form: the same
conv stack with BatchNorm after every conv and the usual single 512->10 linear classifier (the
feature map is 1x1 after five pools of a 32x32 image).
"""

from __future__ import annotations

from torch import nn

from .layers import init_weights

POOL = "M"
# Channels per conv, "M" for a 2x2 max-pool: configurations A, B, D, E of the paper.
CONFIGS = {
    11: (64, POOL, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL),
    13: (64, 64, POOL, 128, 128, POOL, 256, 256, POOL, 512, 512, POOL, 512, 512, POOL),
    16: (64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512, 512, 512, POOL),
    19: (64, 64, POOL, 128, 128, POOL, 256, 256, 256, 256, POOL, 512, 512, 512, 512, POOL,
         512, 512, 512, 512, POOL),
}
BASE_WIDTH = 64  # channels of the first conv (config base_width; smaller only for quick tests)
LAST_WIDTH_FACTOR = 8  # the last stage has 8x the first stage's channels (512)
HIDDEN = 4096  # classifier width (config classifier_width; smaller only for quick tests)
POOLED_SIDE = 7
DROPOUT = 0.5


def features(depth: int, batch_norm: bool, base_width: int = BASE_WIDTH) -> nn.Sequential:
    """The conv stack of VGG-`depth` (3x3 convs, ReLU, optional BatchNorm, 2x2 max-pools).

    `base_width` scales every conv's channels (64 in the paper: 64, 128, 256, 512).
    """
    layers, cin = [], 3
    for item in CONFIGS[depth]:
        if item == POOL:
            layers.append(nn.MaxPool2d(2, 2))
            continue
        cout = item * base_width // BASE_WIDTH
        layers.append(nn.Conv2d(cin, cout, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(cout))
        layers.append(nn.ReLU(inplace=True))
        cin = cout
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG for ImageNet: features, adaptive 7x7 pool, three-layer classifier."""

    def __init__(self, depth: int, num_classes: int, batch_norm: bool, width: int = HIDDEN,
                 base_width: int = BASE_WIDTH):
        super().__init__()
        self.features = features(depth, batch_norm, base_width)
        self.avgpool = nn.AdaptiveAvgPool2d(POOLED_SIDE)
        self.classifier = nn.Sequential(
            nn.Linear(base_width * LAST_WIDTH_FACTOR * POOLED_SIDE ** 2, width), nn.ReLU(inplace=True),
            nn.Dropout(DROPOUT),
            nn.Linear(width, width), nn.ReLU(inplace=True), nn.Dropout(DROPOUT),
            nn.Linear(width, num_classes))
        init_weights(self)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


class VGGCifar(nn.Module):
    """VGG for CIFAR-10: BatchNorm features, global average pool, one linear layer."""

    def __init__(self, depth: int, num_classes: int, batch_norm: bool, base_width: int = BASE_WIDTH):
        super().__init__()
        self.features = features(depth, batch_norm, base_width)
        self.avgpool = nn.AdaptiveAvgPool2d(1)  # 1x1 already at 32x32; keeps larger inputs legal
        self.classifier = nn.Linear(base_width * LAST_WIDTH_FACTOR, num_classes)
        init_weights(self)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def build(depth: int, cifar: bool):
    """A builder ``(config, input_size) -> module`` for the zoo registry."""
    if cifar:
        return lambda config, input_size: VGGCifar(depth, config["num_classes"], config["batch_norm"],
                                                   config["base_width"])
    return lambda config, input_size: VGG(depth, config["num_classes"], config["batch_norm"],
                                          config["classifier_width"], config["base_width"])
