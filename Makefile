# kproxy-ebpf. `make demo` and `make test` work on a fresh Debian 12 machine (as root): both
# run `make setup` first, which installs only what is missing.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
KP    := $(VENV)/bin/kproxy-ebpf
export KPROXY_CACHE ?= /var/cache/kproxy-ebpf

APT_PACKAGES := python3-bpfcc python3-venv linux-headers-cloud-amd64 bpftool clang llvm \
                iproute2 iptables nftables openssl procps util-linux ca-certificates

.PHONY: setup apt venv headers k8s test unit datapath integration e2e conformance demo lab-down lint clean

setup: apt venv headers k8s

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "apt: installing $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing; fi

# The venv sees Debian's bcc (python3-bpfcc) through --system-site-packages; the PyPI "bcc"
# is an unrelated package and is never installed.
$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || /usr/bin/python3 -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@touch $@

venv: apt $(VENV)/.installed

headers: apt
	@tools/setup-headers.sh >/dev/null

k8s:
	@tools/k8s/build.sh >/dev/null

# Root suites use fixed lab names (namespaces, cgroups, pins): two runs on one machine at
# once would tear down each other's labs, so they take turns.
LOCK := flock /run/lock/kproxy-ebpf-tests.lock

# The whole suite: unit, then the root tests (real namespaces, BPF, kube-apiserver).
test: setup
	KPROXY_REQUIRE_ROOT=1 KPROXY_REQUIRE_CONTROLPLANE=1 $(LOCK) $(PY) -m pytest -q tests

unit: venv
	$(PY) -m pytest -q tests/unit

datapath: setup
	$(LOCK) $(PY) -m pytest -q tests/datapath

integration: setup
	$(LOCK) $(PY) -m pytest -q tests/integration

e2e: setup
	$(LOCK) $(PY) -m pytest -q tests/e2e

# Differential Service tests: every scenario against kproxy, kube-proxy nftables and iptables,
# printing the table test x proxy at the end (`make test` runs the kproxy and nftables columns).
conformance: setup
	KPROXY_CONFORMANCE_FULL=1 KPROXY_REQUIRE_ROOT=1 KPROXY_REQUIRE_CONTROLPLANE=1 \
	  $(LOCK) $(PY) -m pytest -q tests/conformance

# The main job on the built-in lab: control plane, two simulated nodes with an agent each,
# pods, a Service, and a probe through its ClusterIP. `make demo ARGS=--keep` leaves it up.
demo: setup
	$(KP) lab demo $(ARGS)

lab-down: venv
	$(KP) lab down

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
