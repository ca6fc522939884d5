"""kuangliu GoogLeNet (Inception v1 adapted to 32x32): 6,166,250 parameters for 10 classes.

A 3x3 stem to 192 channels replaces the ImageNet stem; the "5x5" branch is two 3x3 convs; every
conv has a bias and is followed by BN and ReLU. `width` multiplies every channel count (1.0 =
the paper model).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .layers import GlobalPoolClassifier, conv_bn, scaled_channels

# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection); "pool" = 3x3/2 max-pool.
POOL = "pool"
INCEPTION_LAYOUT = (
    (64, 96, 128, 16, 32, 32),
    (128, 128, 192, 32, 96, 64),
    POOL,
    (192, 96, 208, 16, 48, 64),
    (160, 112, 224, 24, 64, 64),
    (128, 128, 256, 24, 64, 64),
    (112, 144, 288, 32, 64, 64),
    (256, 160, 320, 32, 128, 128),
    POOL,
    (256, 160, 320, 32, 128, 128),
    (384, 192, 384, 48, 128, 128),
)
STEM_CHANNELS = 192


biased_conv = partial(conv_bn, bias=True)


class Inception(nn.Module):
    def __init__(self, in_channels, n1x1, n3x3_reduce, n3x3, n5x5_reduce, n5x5, pool_proj):
        super().__init__()
        self.branches = nn.ModuleList([
            biased_conv(in_channels, n1x1, 1),
            nn.Sequential(biased_conv(in_channels, n3x3_reduce, 1),
                          biased_conv(n3x3_reduce, n3x3, 3)),
            nn.Sequential(biased_conv(in_channels, n5x5_reduce, 1),
                          biased_conv(n5x5_reduce, n5x5, 3),
                          biased_conv(n5x5, n5x5, 3)),
            nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1),
                          biased_conv(in_channels, pool_proj, 1)),
        ])
        self.out_channels = n1x1 + n3x3 + n5x5 + pool_proj

    def forward(self, x):
        return torch.cat([branch(x) for branch in self.branches], dim=1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int, *, width: float):
        super().__init__()
        channels = scaled_channels(STEM_CHANNELS, width)
        layers: list[nn.Module] = [biased_conv(3, channels, 3)]
        for entry in INCEPTION_LAYOUT:
            if entry == POOL:
                layers.append(nn.MaxPool2d(3, stride=2, padding=1))
            else:
                block = Inception(channels, *(scaled_channels(c, width) for c in entry))
                layers.append(block)
                channels = block.out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = GlobalPoolClassifier(channels, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))
