"""`make bench-ddp-network`: a whole DDP training step across a shaped link against the link's
bound (root, iproute2, tc; -> results/bench/ddp_network.{csv,md}; docs/network_bench.md).

The benchmark is benchmarks/ddp_network.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.ddp_network import main

if __name__ == "__main__":
    sys.exit(main())
