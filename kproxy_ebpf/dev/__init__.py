"""The harness, apart from what a node runs (the image leaves this folder out): the lab (a
simulated cluster in network namespaces) and the benchmarks on it."""
