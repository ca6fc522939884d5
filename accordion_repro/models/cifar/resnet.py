"""ResNet-18 for 32x32 inputs, the kuangliu/pytorch-cifar layout the paper trains.

3x3 stem (no 7x7, no max-pool), BasicBlocks [2, 2, 2, 2], bias-free convs with BatchNorm,
global average pool, one linear layer: 11,173,962 parameters for 10 classes.
"""

from __future__ import annotations

from torch import nn

from .layers import ResidualNet, conv_bn, projection_shortcut, scaled_channels

BASE_STAGE_CHANNELS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    """Two 3x3 convs plus a shortcut, ReLU after the sum."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.residual = nn.Sequential(
            conv_bn(in_channels, out_channels, 3, stride=stride),
            conv_bn(out_channels, out_channels, 3, relu=False),
        )
        self.shortcut = projection_shortcut(in_channels, out_channels, stride, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.residual(x) + self.shortcut(x))


class ResNet18(ResidualNet):
    """`width` multiplies every channel count so CPU runs can use a smaller network of the same
    shape; width=1.0 is the paper's model."""

    def __init__(self, num_classes: int, *, width: float):
        super().__init__(BasicBlock, [scaled_channels(c, width) for c in BASE_STAGE_CHANNELS],
                         num_classes, bias=False)
