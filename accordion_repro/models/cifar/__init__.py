"""The CIFAR image classifiers of the paper, for 32x32 RGB inputs."""
