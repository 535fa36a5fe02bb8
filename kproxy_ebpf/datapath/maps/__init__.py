"""The pinned maps as Python sees them: layouts generated from bpf/kproxy.h, row codecs, ids,
sizes, typed access and decoding for the CLI."""
