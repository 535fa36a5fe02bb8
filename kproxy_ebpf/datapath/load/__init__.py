"""Compiling, loading and attaching the BPF programs: bcc in a child process, the program cache,
the socket hooks on a cgroup and the TC programs on devices."""
