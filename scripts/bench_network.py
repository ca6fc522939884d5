"""`make bench-network`: whole-run training time of the CPU study's runs across a shaped link
(root, iproute2, tc; -> results/bench/network*; docs/network_bench.md).

The benchmark is benchmarks/network.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.network import main

if __name__ == "__main__":
    sys.exit(main())
