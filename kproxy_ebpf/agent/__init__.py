"""The node agent: the sync loop and its policy, the sink from the reflectors, reporting, the
self-check, node tuning and `kproxy-ebpf run`."""
