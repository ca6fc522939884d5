"""`make reproduce-cpu`, `reproduce-cpu-full` and `reproduce-cpu-long`: the CPU studies, one run
after another, resumable.

The runner is accordion_repro/reproduce_cpu.py (its docstring says what each study runs,
`--help` its options); this file is its command line.
"""

import sys

from accordion_repro.reproduce_cpu import main

if __name__ == "__main__":
    sys.exit(main())
