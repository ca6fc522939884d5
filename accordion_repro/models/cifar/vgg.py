"""VGG-19 with BatchNorm for CIFAR, with the two classifier heads the official code uses.

The convolutional trunk (biased 3x3 convs + BN + ReLU, five max-pools down to 1x1x512) is the
same for both datasets. The heads differ because the official code took them from two sources:
- CIFAR-10 (chengyangfu/pytorch-vgg-cifar10): Dropout-512-ReLU-Dropout-512-ReLU-classes, with the
  He-normal conv init of that code: 20,565,834 parameters.
- CIFAR-100 (weiaicunzai/pytorch-cifar100): 4096-ReLU-Dropout-4096-ReLU-Dropout-classes with
  PyTorch's default init: 39,327,652 parameters.
The head is picked from `num_classes`: 100 classes or more take the 4096-wide head.
`width` multiplies every conv and hidden head width (1.0 = the paper model; CPU runs use less).
"""

from __future__ import annotations

import math

from torch import nn

from .layers import conv_bn, scaled_channels

POOL = "M"
VGG19_LAYOUT = (64, 64, POOL, 128, 128, POOL, 256, 256, 256, 256, POOL,
                512, 512, 512, 512, POOL, 512, 512, 512, 512, POOL)
WIDE_HEAD_MIN_CLASSES = 100
NARROW_HEAD_WIDTH = 512
WIDE_HEAD_WIDTH = 4096


def vgg_trunk(layout=VGG19_LAYOUT, width: float = 1.0) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    channels = 3
    for entry in layout:
        if entry == POOL:
            layers.append(nn.MaxPool2d(2, 2))
        else:
            out = scaled_channels(entry, width)
            layers.append(conv_bn(channels, out, 3, bias=True))
            channels = out
    return nn.Sequential(*layers), channels


def vgg_head(in_features: int, num_classes: int, hidden: int, *,
             dropout_first: bool) -> nn.Sequential:
    """Two hidden Linear-ReLU layers, each with a Dropout before (narrow head) or after it
    (wide head), then the class layer."""
    layers: list[nn.Module] = []
    for width_in in (in_features, hidden):
        linear_relu = [nn.Linear(width_in, hidden), nn.ReLU(inplace=True)]
        layers += [nn.Dropout(), *linear_relu] if dropout_first else [*linear_relu, nn.Dropout()]
    return nn.Sequential(*layers, nn.Linear(hidden, num_classes))


def he_init_convs(module: nn.Module) -> None:
    """Normal(0, sqrt(2 / (k*k*out_channels))) conv weights and zero biases, as the CIFAR-10
    reference code initialises them (its training recipe was tuned for this init)."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            fan_out = layer.kernel_size[0] * layer.kernel_size[1] * layer.out_channels
            nn.init.normal_(layer.weight, 0.0, math.sqrt(2.0 / fan_out))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


class VGG19BN(nn.Module):
    def __init__(self, num_classes: int, *, width: float):
        super().__init__()
        self.features, channels = vgg_trunk(width=width)
        wide = num_classes >= WIDE_HEAD_MIN_CLASSES
        hidden = scaled_channels(WIDE_HEAD_WIDTH if wide else NARROW_HEAD_WIDTH, width)
        self.classifier = vgg_head(channels, num_classes, hidden, dropout_first=not wide)
        if not wide:
            he_init_convs(self.features)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
