"""MobileNet v1 (Howard et al. 2017) and MobileNet v2 (Sandler et al. 2018), width multiplier 1.0."""

from __future__ import annotations

from torch import nn

from .layers import conv_bn_relu, init_weights

# v1: (output channels, stride) of each depthwise-separable block after the 32-channel stem.
V1_BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
             (512, 1), (512, 1), (1024, 2), (1024, 1))
V1_STEM = 32
# v2: (expansion t, output channels c, repeats n, first stride s) of the inverted-residual stages.
V2_STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
             (6, 320, 1, 1))
V2_STEM = 32
V2_LAST = 1280
V2_DROPOUT = 0.2


class MobileNetV1(nn.Module):
    """Stem conv, 13 depthwise-separable blocks (3x3 depthwise + 1x1 pointwise), pool, linear."""

    def __init__(self, num_classes: int):
        super().__init__()
        layers, cin = [conv_bn_relu(3, V1_STEM, 3, 2)], V1_STEM
        for cout, stride in V1_BLOCKS:
            layers.append(nn.Sequential(conv_bn_relu(cin, cin, 3, stride, groups=cin),
                                        conv_bn_relu(cin, cout, 1)))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x):
        return self.fc(self.avgpool(self.features(x)).flatten(1))


class InvertedResidual(nn.Module):
    """1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear project; residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn_relu(cin, hidden, 1, act=nn.ReLU6)] if expand != 1 else []
        layers += [conv_bn_relu(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.conv(x) if self.use_residual else self.conv(x)


class MobileNetV2(nn.Module):
    """Stem conv, 17 inverted-residual blocks, 1x1 conv to 1280, pool, dropout, linear."""

    def __init__(self, num_classes: int):
        super().__init__()
        layers, cin = [conv_bn_relu(3, V2_STEM, 3, 2, act=nn.ReLU6)], V2_STEM
        for expand, cout, repeats, stride in V2_STAGES:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(conv_bn_relu(cin, V2_LAST, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(V2_DROPOUT), nn.Linear(V2_LAST, num_classes))
        init_weights(self)

    def forward(self, x):
        return self.classifier(self.avgpool(self.features(x)).flatten(1))


def build_v1(config: dict, input_size) -> nn.Module:
    """Zoo builder for MobileNet v1."""
    return MobileNetV1(config["num_classes"])


def build_v2(config: dict, input_size) -> nn.Module:
    """Zoo builder for MobileNet v2."""
    return MobileNetV2(config["num_classes"])
