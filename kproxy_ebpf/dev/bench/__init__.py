"""The project's benchmarks, all of them here; their results are kept in bench/results/.

`kproxy-ebpf bench`: kproxy against upstream kube-proxy (iptables, nftables) and the direct
path to a pod, in the lab, on one machine, in one run (issue 9), and the 10,000-Service scale
run (issue 11, `--scale`). Numbers are printed and stored in bench/results/ (the history of
every committed run); nothing here is a test and nothing is asserted. The unit tests of this
code are tests/unit/dev/bench/test_bench_*.py. Not in the agent's image (Dockerfile).

Modules, one job each: stats (pure statistics), goals (performance.md section 10 as checks),
report/plots (latest.md, README section, PNGs), env (what the numbers were measured on),
rawapi/fill (fast API writes: the N filler Services and EndpointSlices, churn), procstat (CPU
and memory of a proxy and its children), loadgen (the compiled client and server in lab pods),
testbed (the lab, the live backends, starting and cleaning each proxy mode), suite (the
benchmark), scale (the scale run), cli (the click command); kpbench_client.c and
kpbench_server.c (the load generator and its backend, `make bench-tools`). Two benchmarks of one
component each, run by hand: map_writer (the map writer alone on real pinned maps, root) and
agent_profile (the agent's CPU and memory at N Services without a cluster or a kernel).
"""
