"""What the artifact's commands cost: wall time, CPU time and peak memory under /usr/bin/time -v
(-> results/bench/artifact_resources.csv; docs/artifact.md).

The benchmark is benchmarks/artifact_resources.py (its docstring says what it measures, `--help`
its options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.artifact_resources import main

if __name__ == "__main__":
    sys.exit(main())
