"""The benchmark harness and the benchmarks built on it; scripts/bench_*.py are their command
lines, and ranks started as subprocesses run `python -m accordion_repro.benchmarks.<module>`.
Installed as accordion_repro.benchmarks (pyproject.toml's package-dir; no top-level name of
ours in site-packages); its modules import each other relatively, so that `python3 -m
benchmarks.gpu_check` from the checkout's root, with nothing installed, runs the same files.

- harness.py: what every benchmark shares: loopback and torchrun-style ranks, the timed Arm,
  interleaved rounds, quartiles, the CSV;
- compressors.py, ddp_step.py (+ ddp_phases.py), fsdp_traffic.py, model_steps.py,
  step_options.py: loopback and single-process benchmarks (`make bench`, `make bench-models`);
- ddp_network.py, network.py and netbench/: the same across a tc-shaped veth link between two
  network namespaces (root, iproute2, tc; docs/network_bench.md);
- gpu_check.py (`make gpu-check`, `python3 -m benchmarks.gpu_check` where nothing is installed)
  and gpu_parts.py, its measuring parts.
"""
