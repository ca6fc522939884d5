"""Accordion (MLSys 2021) reproduction suite: adaptive gradient communication."""

__version__ = "0.1.0"
