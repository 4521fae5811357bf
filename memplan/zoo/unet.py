"""U-Net (Ronneberger et al. 2015): four 2x down-samplings, 64..1024 channels, skip concatenations.

Convs are padded (output size = input size, so the input side must be a multiple of 16) and
followed by BatchNorm (config ``batch_norm``), as in common PyTorch U-Nets; up-sampling is a 2x2
transposed conv. Loss: per-pixel cross-entropy against a random class mask.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import MemplanError
from .layers import init_weights

LEVELS = 4
DOWN_FACTOR = 2 ** LEVELS


def double_conv(cin: int, cout: int, batch_norm: bool) -> nn.Sequential:
    """Two 3x3 padded convs, each with optional BatchNorm and ReLU."""
    layers = []
    for c in (cin, cout):
        layers.append(nn.Conv2d(c, cout, 3, padding=1, bias=not batch_norm))
        layers += [nn.BatchNorm2d(cout)] if batch_norm else []
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class Up(nn.Module):
    """2x2 transposed conv halving channels, concatenation with the skip, double conv."""

    def __init__(self, cin: int, batch_norm: bool):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, 2)
        self.conv = double_conv(cin, cin // 2, batch_norm)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], 1))


class UNet(nn.Module):
    """Encoder of double convs and max-pools, bottleneck, decoder of `Up` blocks, 1x1 classifier."""

    def __init__(self, in_channels: int, num_classes: int, base: int, batch_norm: bool):
        super().__init__()
        widths = [base * 2 ** i for i in range(LEVELS + 1)]
        self.inc = double_conv(in_channels, base, batch_norm)
        self.downs = nn.ModuleList(nn.Sequential(nn.MaxPool2d(2), double_conv(a, b, batch_norm))
                                   for a, b in zip(widths, widths[1:]))
        self.ups = nn.ModuleList(Up(w, batch_norm) for w in reversed(widths[1:]))
        self.outc = nn.Conv2d(base, num_classes, 1)
        init_weights(self)

    def forward(self, x):
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.outc(x)


def build(config: dict, input_size: int) -> nn.Module:
    """Zoo builder; the input side must be a multiple of 16."""
    if input_size % DOWN_FACTOR:
        raise MemplanError(f"unet: input_size must be a multiple of {DOWN_FACTOR}, got {input_size}")
    return UNet(config["in_channels"], config["num_classes"], config["base_channels"], config["batch_norm"])
