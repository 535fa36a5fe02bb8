"""kproxy-ebpf: an eBPF replacement for kube-proxy.

Layers (one-way): kube/ turns API objects into the lean types of model.py; proxy/ turns those
into the desired datapath state (pure, no I/O); datapath/ writes that state into pinned BPF maps.
"""
__version__ = "0.1.0"
