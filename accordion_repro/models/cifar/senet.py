"""SE-ResNet-18 in the weiaicunzai/pytorch-cifar100 layout used by the official Accordion code.

Differs from the kuangliu ResNet-18: every conv (including the 1x1 projection) carries a bias,
the second conv of a block is followed by ReLU *before* squeeze-excitation, the SE gate is two
Linear layers with reduction 16, and ReLU follows the residual sum. The official stage 4 width
is 516 (a typo for 512); `stage4_channels` chooses between them. `width` multiplies every
channel count (stage 4's too; 1.0 = the paper model).

Submodules are registered in the official order (residual, shortcut, excitation), so the
parameter list, and with it every per-layer level and log, lines up with the official one.
"""

from __future__ import annotations

from torch import nn

from ..settings import SE_REDUCTION
from .layers import ResidualNet, conv_bn, projection_shortcut, scaled_channels

FIRST_STAGES_CHANNELS = (64, 128, 256)
MIN_SE_HIDDEN = 4


class SqueezeExcitation(nn.Module):
    """Per-channel gate in (0, 1) computed from the globally pooled feature map."""

    def __init__(self, channels: int, reduction: int = SE_REDUCTION):
        super().__init__()
        # At least 4 units: at width 1 every stage has >= 64 / 16 = 4 anyway, and a 1-unit gate
        # of a narrow (width < 1) model is easily dead from the start.
        hidden = max(MIN_SE_HIDDEN, channels // reduction)
        self.gate = nn.Sequential(
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(1),
            nn.Linear(channels, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, channels),
            nn.Sigmoid(),
        )

    def forward(self, x):
        return self.gate(x)[:, :, None, None]


class SEBasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.residual = nn.Sequential(
            conv_bn(in_channels, out_channels, 3, stride=stride, bias=True),
            conv_bn(out_channels, out_channels, 3, bias=True),
        )
        self.shortcut = projection_shortcut(in_channels, out_channels, stride, bias=True)
        self.excitation = SqueezeExcitation(out_channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        residual = self.residual(x)
        return self.relu(residual * self.excitation(residual) + self.shortcut(x))


class SENet18(ResidualNet):
    def __init__(self, num_classes: int, *, stage4_channels: int, width: float):
        super().__init__(SEBasicBlock, [scaled_channels(c, width)
                                        for c in (*FIRST_STAGES_CHANNELS, stage4_channels)],
                         num_classes, bias=True)
