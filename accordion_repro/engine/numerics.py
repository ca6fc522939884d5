"""What decides a run's last bits besides its config, written into its summary.json.

A CPU run computes the same bits only on the same instruction set, torch build and packing of
PowerSGD's buffers: the analysis refuses to pair runs that differ in `powersgd_packing` (a code
change) and every table names the CPU kind that ran it. `isa_cap` records the variables that
hold torch, MKL and oneDNN to a narrower instruction set than the CPU has: the study queue sets
them to AVX2 (reproduce_cpu.AVX2_CAP), and then an AVX512 machine computes what an AVX2 one does.
"""

from __future__ import annotations

import os
import platform

import torch

from accordion_repro.comm.powersgd import PACKING
from accordion_repro.engine.precision import cpu_bf16_is_emulated

ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_model() -> str:
    """The CPU's marketing name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numerics_record() -> dict:
    return {"torch": torch.__version__,
            "cpu_model": cpu_model(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "bf16": "emulated" if cpu_bf16_is_emulated() else "native",
            "isa_cap": {name: os.environ[name] for name in ISA_VARIABLES if name in os.environ},
            "powersgd_packing": PACKING}
