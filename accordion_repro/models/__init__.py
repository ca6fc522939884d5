"""Models of the paper (facts section 6) as plain nn.Modules, built by config name."""

from .factory import MODEL_NAMES, build_model, count_parameters
from .lstm import detach_hidden

__all__ = ["MODEL_NAMES", "build_model", "count_parameters", "detach_hidden"]
