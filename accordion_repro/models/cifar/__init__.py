"""The CIFAR image classifiers of the paper, for 32x32 RGB inputs."""

from .densenet import DenseNet
from .googlenet import GoogLeNet
from .resnet import ResNet18
from .senet import SENet18
from .vgg import VGG19BN

__all__ = ["DenseNet", "GoogLeNet", "ResNet18", "SENet18", "VGG19BN"]
