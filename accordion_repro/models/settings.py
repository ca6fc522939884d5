"""Each model's options (`model.*`), one default each: the paper's model.

Models are also built without Hydra (tests, benchmarks), so the defaults live here and conf/
gets them through `_defaults/model/<name>` (config.py register_defaults). A run that changes a
size option trains a reduced model, which the analysis reads off these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..options import Options, Settings, option

SE_REDUCTION = 16  # squeeze-excitation gate: channels // 16 hidden units


@dataclass(frozen=True, kw_only=True)
class WidthSettings(Settings):
    SECTION = "model"
    width: float = option(
        Options.number, default=1.0, added=1.0,
        help="channel multiplier (1.0: the paper's model)")


@dataclass(frozen=True, kw_only=True)
class SENetSettings(WidthSettings):
    # The official code has 516 stage-4 channels (a typo); 512 is the intended width, 516
    # reproduces the released model exactly.
    stage4_channels: int = option(
        Options.integer, minimum=SE_REDUCTION, default=512,
        help="channels of SENet18's stage 4 (512 intended; the official code's 516 reproduces its "
             "model)")


@dataclass(frozen=True, kw_only=True)
class LSTMSettings(Settings):
    SECTION = "model"
    num_layers: int = option(Options.integer, default=3, help="stacked LSTM layers")
    hidden_size: int = option(Options.integer, default=650, help="hidden units per LSTM layer")
    embedding_size: int = option(Options.integer, default=650, help="size of the word embedding")
    tied: bool = option(
        Options.flag, default=True,
        help="the decoder shares the embedding matrix (needs embedding_size = hidden_size)")
    dropout: float = option(
        Options.number, closed="low", high=1.0, default=0.4,
        help="dropout probability between layers")

    @classmethod
    def read(cls, o: Options):
        """The options, and tied weights' sizes checked here, before any rank starts (the
        model's own check came after resolved.yaml was written: issue 56's CLI audit)."""
        settings = super().read(o)
        if settings.tied and settings.embedding_size != settings.hidden_size:
            raise ConfigError(
                "model.tied",
                f"tied weights need embedding_size == hidden_size, got {settings.embedding_size} "
                f"and {settings.hidden_size}; set model.tied=false or make the sizes equal")
        return settings


# The options that scale a model down from the paper's (the analysis names a run that changes one).
SIZE_OPTIONS = ("width", "stage4_channels", "num_layers", "hidden_size", "embedding_size")
