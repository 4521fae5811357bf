"""Building blocks shared by the zoo's networks, and the usual initialisation."""

from __future__ import annotations

from torch import nn

# Standard deviation of the classifier's normal init (as torchvision and the papers' Caffe models).
LINEAR_INIT_STD = 0.01


def conv_bn_relu(cin: int, cout: int, kernel: int = 3, stride: int = 1, padding: int | None = None,
                 groups: int = 1, eps: float = 1e-5, act: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    """Conv (no bias) + BatchNorm + activation; padding defaults to 'same' for odd kernels."""
    padding = kernel // 2 if padding is None else padding
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
                         nn.BatchNorm2d(cout, eps=eps), act(inplace=True))


def init_weights(model: nn.Module) -> nn.Module:
    """He-normal convs (fan-out), unit BatchNorm, small-normal linears, zero biases; returns `model`."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d) or isinstance(m, nn.ConvTranspose2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, LINEAR_INIT_STD)
            nn.init.zeros_(m.bias)
    return model
