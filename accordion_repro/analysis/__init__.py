"""Run directories -> tidy DataFrame -> Tables 1-6, Figures 2/9/10 and the comparison tables.

Reads run directories only (never engine/ or wandb); the network cost model it prices runs with
is accordion_repro/costmodel.py. The entry point is
`build_all(runs_dir, out_dir, net="10gbit", workers=None)`; the table and figure layout is
`accordion_repro.analysis.layout.TABLES` / `FIGURES`. Imports stay lazy so that importing the
layout does not load pandas or matplotlib.
"""


def __getattr__(name):
    if name == "build_all":
        from accordion_repro.analysis.build import build_all
        return build_all
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["build_all"]
