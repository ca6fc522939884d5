"""The pilots that size the fp32 study's scale (-> results/bench/study_pilots.csv).

The benchmark is benchmarks/study_pilot.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.study_pilot import main

if __name__ == "__main__":
    sys.exit(main())
