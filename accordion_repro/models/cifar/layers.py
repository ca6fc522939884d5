"""Building blocks the CIFAR networks share, so each network file states only its layout."""

from __future__ import annotations

from typing import Callable

from torch import nn


def scaled_channels(channels: int, width: float) -> int:
    """Channel count after a width multiplier (CPU-sized models); never below one channel."""
    return max(1, int(round(channels * width)))


def conv_bn(in_channels: int, out_channels: int, kernel_size: int, *, stride: int = 1,
            bias: bool = False, relu: bool = True) -> nn.Sequential:
    """Conv -> BatchNorm (-> ReLU) with 'same' padding.

    `bias` is explicit because the reference networks differ: kuangliu's ResNet/DenseNet drop the
    conv bias (BN makes it redundant) while the VGG, GoogLeNet and weiaicunzai SENet keep it, and
    the bias vectors count towards the published parameter totals.
    """
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                  padding=kernel_size // 2, bias=bias),
        nn.BatchNorm2d(out_channels),
    ]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def projection_shortcut(in_channels: int, out_channels: int, stride: int, *,
                        bias: bool) -> nn.Module:
    """Identity when shapes match, else the 1x1 conv + BN projection of the ResNet papers."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return conv_bn(in_channels, out_channels, 1, stride=stride, bias=bias, relu=False)


class GlobalPoolClassifier(nn.Module):
    """Global average pool, flatten, linear.

    The reference code pools with a fixed window (4 or 8) that equals the final feature map for
    32x32 inputs; adaptive pooling is identical there and also accepts other input sizes.
    """

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.linear(self.pool(x).flatten(1))


class ResidualNet(nn.Module):
    """3x3 stem, residual stages, global pool + linear: the ResNet-18 and SE-ResNet-18 layout.

    `block(in_channels, out_channels, stride)` builds one block; the first stage keeps the
    resolution, the first block of every later stage halves it.
    """

    def __init__(self, block: Callable[[int, int, int], nn.Module], stage_channels: list[int],
                 num_classes: int, *, bias: bool, blocks_per_stage=(2, 2, 2, 2)):
        super().__init__()
        self.stem = conv_bn(3, stage_channels[0], 3, bias=bias)
        stages, in_channels = [], stage_channels[0]
        for index, (channels, num_blocks) in enumerate(zip(stage_channels, blocks_per_stage)):
            blocks = []
            for block_index in range(num_blocks):
                stride = 2 if index > 0 and block_index == 0 else 1
                blocks.append(block(in_channels, channels, stride))
                in_channels = channels
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.classifier = GlobalPoolClassifier(in_channels, num_classes)

    def forward(self, x):
        return self.classifier(self.stages(self.stem(x)))
