"""Errors the user can act on.

A ConfigError names the config key at fault so the message can be fixed on the command line
before any rank starts; a DatasetMissingError says in one line where the files are expected.
"""


class ConfigError(ValueError):
    """A composed config value is unknown or out of range."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


class ConfigWarning(UserWarning):
    """A config value is used, but not as written (a decay moved or dropped). train.py shows it
    once, as one line, before the ranks start; the ranks do not repeat it."""


class AccordionWarning(UserWarning):
    """A setting Accordion accepts but that defeats its purpose (a Top-K level that sends more
    than no compression, an LR rule that fires every epoch)."""


class DatasetMissingError(FileNotFoundError):
    """The dataset files are not where the config says; the message says how to get them."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message names the epoch and step."""
