"""The CLI audit: bad inputs refused in one line, killed runs resumed to identical metrics
(-> results/bench/cli_audit.csv).

The benchmark is benchmarks/cli_audit.py (its docstring says what it checks, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.cli_audit import main

if __name__ == "__main__":
    sys.exit(main())
