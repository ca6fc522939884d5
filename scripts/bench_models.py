"""`make bench-models`, first: one training step of every model on this CPU
(-> results/bench/models.csv).

The benchmark is benchmarks/model_steps.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.model_steps import main

if __name__ == "__main__":
    sys.exit(main())
