"""Build `cifar10_jpeg_50k_10k.npz` (what `dataset=cifar10_jpeg` reads) from its public source.

The builder is accordion_repro/data/build_cifar10_jpeg_npz.py (its docstring names the source
and the file's md5, `--help` its options); this file is its command line.
"""

import sys

from accordion_repro.data.build_cifar10_jpeg_npz import main

if __name__ == "__main__":
    sys.exit(main())
