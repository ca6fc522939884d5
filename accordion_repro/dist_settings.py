"""The launcher's options (conf/dist holds their defaults), read without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

from accordion_repro.options import Options, Settings, option


@dataclass(frozen=True)
class DistSettings(Settings):
    SECTION = "dist"
    nproc_per_node: int = option(Options.integer)  # ranks to start when not under torchrun / Slurm
    backend: str = option(Options.choice, ("auto", "gloo", "nccl"))
    launcher: str = option(Options.choice, ("auto", "spawn", "env"))
    master_addr: str = option(Options.get)
    timeout_s: int = option(Options.get)
