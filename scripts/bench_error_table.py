"""The cost of one `schedule=auto` / L-GreCo check on rank 0: every layer's error table
(-> results/bench/error_table.csv).

The benchmark is benchmarks/error_table.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.error_table import main

if __name__ == "__main__":
    sys.exit(main())
