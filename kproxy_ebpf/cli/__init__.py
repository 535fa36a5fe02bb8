"""The `kproxy-ebpf` command (and the kubectl plugin): every subcommand, mounting the lab and
the benchmarks when they are installed."""
