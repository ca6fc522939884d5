"""`make bench`, first: the gradient reducers on 2 gloo ranks (-> results/bench/compressors.csv).

The benchmark is benchmarks/compressors.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.compressors import main

if __name__ == "__main__":
    sys.exit(main())
