"""Inception v3 (Szegedy et al. 2015) at 299x299, torchvision's layout without the auxiliary head."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .layers import init_weights

BN_EPS = 1e-3
DROPOUT = 0.5
FINAL_CHANNELS = 2048


class BasicConv2d(nn.Sequential):
    """Conv (no bias) + BatchNorm (eps 1e-3) + ReLU, with any kernel/padding shape."""

    def __init__(self, cin: int, cout: int, kernel, stride: int = 1, padding=0):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(cout, eps=BN_EPS), nn.ReLU(inplace=True))


def _pool_branch(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.AvgPool2d(3, 1, 1), BasicConv2d(cin, cout, 1))


def _factorized(cin: int, widths, kernels, last_stride: int = 1) -> nn.Sequential:
    """A chain of convs; `kernels` are (kh, kw) with 'same' padding except a strided last one."""
    layers = []
    for i, (cout, (kh, kw)) in enumerate(zip(widths, kernels)):
        strided = last_stride > 1 and i == len(widths) - 1
        layers.append(BasicConv2d(cin, cout, (kh, kw), last_stride if strided else 1,
                                  0 if strided else (kh // 2, kw // 2)))
        cin = cout
    return nn.Sequential(*layers)


class _Branches(nn.Module):
    """Runs its branches on the same input and concatenates them on channels."""

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.children()], 1)


class InceptionA(_Branches):
    """35x35 block: 1x1, 5x5, double 3x3 and pool branches."""

    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 64, 1)
        self.branch5x5 = _factorized(cin, (48, 64), ((1, 1), (5, 5)))
        self.branch3x3dbl = _factorized(cin, (64, 96, 96), ((1, 1), (3, 3), (3, 3)))
        self.branch_pool = _pool_branch(cin, pool_features)


class InceptionB(_Branches):
    """35->17 grid reduction: strided 3x3, strided double 3x3, max-pool."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, 384, 3, 2)
        self.branch3x3dbl = _factorized(cin, (64, 96, 96), ((1, 1), (3, 3), (3, 3)), last_stride=2)
        self.branch_pool = nn.MaxPool2d(3, 2)


class InceptionC(_Branches):
    """17x17 block with 1x7/7x1 factorised convs of width `c7`."""

    def __init__(self, cin: int, c7: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 192, 1)
        self.branch7x7 = _factorized(cin, (c7, c7, 192), ((1, 1), (1, 7), (7, 1)))
        self.branch7x7dbl = _factorized(cin, (c7, c7, c7, c7, 192),
                                        ((1, 1), (7, 1), (1, 7), (7, 1), (1, 7)))
        self.branch_pool = _pool_branch(cin, 192)


class InceptionD(_Branches):
    """17->8 grid reduction."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch3x3 = _factorized(cin, (192, 320), ((1, 1), (3, 3)), last_stride=2)
        self.branch7x7x3 = _factorized(cin, (192, 192, 192, 192), ((1, 1), (1, 7), (7, 1), (3, 3)),
                                       last_stride=2)
        self.branch_pool = nn.MaxPool2d(3, 2)


class _SplitBranch(nn.Module):
    """A stem conv chain followed by parallel 1x3 and 3x1 convs, concatenated."""

    def __init__(self, stem: nn.Module, width: int):
        super().__init__()
        self.stem = stem
        self.a = BasicConv2d(width, 384, (1, 3), padding=(0, 1))
        self.b = BasicConv2d(width, 384, (3, 1), padding=(1, 0))

    def forward(self, x):
        x = self.stem(x)
        return torch.cat([self.a(x), self.b(x)], 1)


class InceptionE(_Branches):
    """8x8 block with expanded filter-bank outputs."""

    def __init__(self, cin: int):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, 320, 1)
        self.branch3x3 = _SplitBranch(BasicConv2d(cin, 384, 1), 384)
        self.branch3x3dbl = _SplitBranch(_factorized(cin, (448, 384), ((1, 1), (3, 3))), 384)
        self.branch_pool = _pool_branch(cin, 192)


class InceptionV3(nn.Module):
    """Stem (five convs, two max-pools), 3xA, B, 4xC, D, 2xE, global pool, dropout, linear."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.stem = nn.Sequential(
            BasicConv2d(3, 32, 3, 2), BasicConv2d(32, 32, 3), BasicConv2d(32, 64, 3, padding=1),
            nn.MaxPool2d(3, 2), BasicConv2d(64, 80, 1), BasicConv2d(80, 192, 3), nn.MaxPool2d(3, 2))
        self.mixed = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(FINAL_CHANNELS))
        self.dropout = nn.Dropout(DROPOUT)
        self.fc = nn.Linear(FINAL_CHANNELS, num_classes)
        init_weights(self)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.mixed(self.stem(x)), 1).flatten(1)
        return self.fc(self.dropout(x))


def build(config: dict, input_size) -> nn.Module:
    """Zoo builder for Inception v3 (input at least 75x75)."""
    return InceptionV3(config["num_classes"])
