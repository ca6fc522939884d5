"""Benchmarks that are not part of the installed package: they need root, iproute2 and tc (two
network namespaces joined by a shaped veth link). Run from the repository root
(`make bench-network`); the tests that use them import `benchmarks.netbench` from there."""
