"""ResNet-18/34/50/101/152 (He et al. 2015), ImageNet and CIFAR-10 forms.

ImageNet form: 7x7/2 stem conv and 3x3/2 max-pool, four stages (64..512 base channels), global
average pool, linear classifier (resnet50: 25.6M parameters, torchvision's v1.5 layout with the
stride on the 3x3 conv; config ``base_width`` scales all channels, for quick tests).

CIFAR-10 form (paper 000 trains these ImageNet depths on CIFAR-10): the same stages on a 3x3/1
stem conv without max-pool, so a 32x32 image reaches layer4 at 4x4 (as kuangliu/pytorch-cifar).
"""

from __future__ import annotations

from torch import nn

from .layers import init_weights

# Blocks per stage and block type for each depth.
DEPTHS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)), 50: ("bottleneck", (3, 4, 6, 3)),
          101: ("bottleneck", (3, 4, 23, 3)), 152: ("bottleneck", (3, 8, 36, 3))}
BASE_WIDTH = 64  # stem and first-stage channels (config base_width; smaller only for quick tests)
STAGE_FACTORS = (1, 2, 4, 8)  # stage widths relative to the base: 64, 128, 256, 512
BOTTLENECK_EXPANSION = 4


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """Two 3x3 convs with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        self.conv1, self.bn1 = _conv_bn(cin, width, 3, stride)
        self.relu = nn.ReLU(inplace=True)
        self.conv2, self.bn2 = _conv_bn(width, width, 3)
        self.downsample = _shortcut(cin, width, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, with a projection shortcut where shapes change."""

    expansion = BOTTLENECK_EXPANSION

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * BOTTLENECK_EXPANSION
        self.conv1, self.bn1 = _conv_bn(cin, width, 1)
        self.conv2, self.bn2 = _conv_bn(width, width, 3, stride)
        self.conv3, self.bn3 = _conv_bn(width, cout, 1)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _shortcut(cin, cout, stride)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(*_conv_bn(cin, cout, 1, stride))


class ResNet(nn.Module):
    """ResNet of `depth`; `cifar` selects the 3x3/1 stem without max-pool."""

    def __init__(self, depth: int, num_classes: int, cifar: bool = False, base_width: int = BASE_WIDTH):
        super().__init__()
        kind, counts = DEPTHS[depth]
        block = BasicBlock if kind == "basic" else Bottleneck
        if cifar:
            self.conv1, self.bn1 = _conv_bn(3, base_width, 3)
            self.maxpool = nn.Identity()
        else:
            self.conv1, self.bn1 = _conv_bn(3, base_width, 7, 2)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.relu = nn.ReLU(inplace=True)
        cin = base_width
        for i, count in enumerate(counts):
            width = base_width * STAGE_FACTORS[i]
            stride = 1 if i == 0 else 2
            blocks = [block(cin if j == 0 else width * block.expansion, width, stride if j == 0 else 1)
                      for j in range(count)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            cin = width * block.expansion
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        init_weights(self)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def build(depth: int, cifar: bool):
    """A builder ``(config, input_size) -> module`` for the zoo registry."""
    return lambda config, input_size: ResNet(depth, config["num_classes"], cifar, config["base_width"])
