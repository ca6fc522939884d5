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


BlockFactory = Callable[[int, int, int], nn.Module]   # (in_channels, out_channels, stride)


def residual_stages(block: BlockFactory, in_channels: int, stage_channels: list[int],
                    blocks_per_stage: list[int]) -> tuple[nn.Sequential, int]:
    """Stack residual stages; the first stage keeps resolution, later ones halve it.

    Returns the stages and the channel count they end with (the classifier's input width).
    """
    stages = []
    for index, (channels, num_blocks) in enumerate(zip(stage_channels, blocks_per_stage)):
        first_stride = 1 if index == 0 else 2
        blocks = []
        for block_index in range(num_blocks):
            blocks.append(block(in_channels, channels, first_stride if block_index == 0 else 1))
            in_channels = channels
        stages.append(nn.Sequential(*blocks))
    return nn.Sequential(*stages), in_channels


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
