"""Bytes per rank and step under FSDP2, plain FSDP against FSDP + Accordion's PowerSGD, and
(with --bandwidth, root) the whole step through a shaped link (-> results/bench/fsdp_traffic.csv;
docs/fsdp.md).

The benchmark is benchmarks/fsdp_traffic.py (its docstring says what it measures, `--help` its
options); this file is its command line.
"""

import sys

from accordion_repro.benchmarks.fsdp_traffic import main

if __name__ == "__main__":
    sys.exit(main())
