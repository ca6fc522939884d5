"""`make bench`, second: a real DDP training step on 2 gloo ranks, torch's hooks against ours
(-> results/bench/ddp.csv).

The benchmark is benchmarks/ddp_step.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.ddp_step import main

if __name__ == "__main__":
    sys.exit(main())
