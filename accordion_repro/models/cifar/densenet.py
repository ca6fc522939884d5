"""kuangliu `densenet_cifar`: DenseNet-BC with growth 12, blocks [6, 12, 24, 16], reduction 0.5.

Pre-activation bottleneck layers (BN-ReLU-1x1 conv to 4*growth, BN-ReLU-3x3 conv to growth) whose
output is concatenated in front of their input; transitions (BN-ReLU-1x1 conv-avgpool 2) halve
the channels. 1,000,618 parameters for 10 classes. `width` multiplies the growth rate (so
every channel count; 1.0 = the paper model).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .layers import GlobalPoolClassifier, scaled_channels


def bn_relu_conv(in_channels: int, out_channels: int, kernel_size: int) -> nn.Sequential:
    return nn.Sequential(
        nn.BatchNorm2d(in_channels),
        nn.ReLU(inplace=True),
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False),
    )


class Bottleneck(nn.Module):
    def __init__(self, in_channels: int, growth_rate: int):
        super().__init__()
        self.layers = nn.Sequential(
            bn_relu_conv(in_channels, 4 * growth_rate, 1),
            bn_relu_conv(4 * growth_rate, growth_rate, 3),
        )

    def forward(self, x):
        # New features first, then the input: kuangliu's channel order.
        return torch.cat([self.layers(x), x], dim=1)


class Transition(nn.Sequential):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(bn_relu_conv(in_channels, out_channels, 1), nn.AvgPool2d(2))


class DenseNet(nn.Module):
    def __init__(self, num_classes: int, growth_rate: int = 12,
                 blocks=(6, 12, 24, 16), reduction: float = 0.5, *, width: float):
        super().__init__()
        growth_rate = scaled_channels(growth_rate, width)
        channels = 2 * growth_rate
        layers: list[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1, bias=False)]
        for index, num_layers in enumerate(blocks):
            for _ in range(num_layers):
                layers.append(Bottleneck(channels, growth_rate))
                channels += growth_rate
            if index < len(blocks) - 1:
                reduced = int(math.floor(channels * reduction))
                layers.append(Transition(channels, reduced))
                channels = reduced
        layers += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = GlobalPoolClassifier(channels, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))
