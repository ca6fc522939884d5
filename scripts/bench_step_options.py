"""`make bench-models`, second: what makes one rank's step cheaper here (bf16, channels_last,
compile, the input pipeline; -> results/bench/step_options.csv).

The benchmark is benchmarks/step_options.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.step_options import main

if __name__ == "__main__":
    sys.exit(main())
