# kproxy-ebpf agent image: Debian, bcc (python3-bpfcc), the package, and its own merged kernel
# header tree for bcc. The BPF programs use UAPI types only, so this tree works on any kernel at
# or above the minimum: the host's /lib/modules and /usr/src are never mounted.
#
# Users build on debian:bookworm-slim. `make image` (no registry reachable) passes a local base
# made from Debian's packages by mmdebstrap and builds this same file with podman.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# --- stage 1: the header tree, from the .debs unpacked (not installed: installing them would
# pull gcc and kbuild into the image). Same merge as tools/setup-headers.sh: -common first, then
# the flavour package on top.
FROM ${BASE_IMAGE} AS headers
ARG HEADERS_FLAVOUR=cloud-amd64
RUN set -eux; \
    apt-get update; \
    flavour=$(apt-cache depends "linux-headers-${HEADERS_FLAVOUR}" \
              | sed -n 's/^ *Depends: \(linux-headers-.*\)$/\1/p' | head -1); \
    abi=$(echo "$flavour" | sed -E 's/^linux-headers-([0-9.]+-[0-9]+)-.*$/\1/'); \
    mkdir -p /tmp/debs /tmp/x && chown _apt /tmp/debs && cd /tmp/debs; \
    apt-get download "$flavour" "linux-headers-${abi}-common"; \
    for d in *.deb; do dpkg-deb -x "$d" /tmp/x; done; \
    mkdir -p /opt/kproxy-ebpf/headers; \
    cp -a "/tmp/x/usr/src/linux-headers-${abi}-common/." /opt/kproxy-ebpf/headers/; \
    cp -a "/tmp/x/usr/src/${flavour}/." /opt/kproxy-ebpf/headers/; \
    test -f /opt/kproxy-ebpf/headers/include/uapi/linux/bpf.h; \
    echo "$flavour" > /opt/kproxy-ebpf/headers/.source; \
    rm -rf /tmp/debs /tmp/x /var/lib/apt/lists/*

# --- stage 2: the agent
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
# python3-bpfcc: Debian's bcc (the PyPI "bcc" is unrelated). libbpf1: datapath/libbpf.py binds
# libbpf.so.1 directly. util-linux: `mount -t bpf` when the node has no bpffs at /sys/fs/bpf.
# iptables, nftables, ipset, ipvsadm: kube-proxy's leftovers removed from the agent's pod
# (`kubeProxyCleanup`, `kproxy-ebpf cleanup --kube-proxy-leftovers`), IPVS mode's included.
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc libbpf1 \
        ca-certificates util-linux iptables nftables ipset ipvsadm; \
    rm -rf /var/lib/apt/lists/*
COPY --from=headers /opt/kproxy-ebpf/headers /opt/kproxy-ebpf/headers
ENV BCC_KERNEL_SOURCE=/opt/kproxy-ebpf/headers

# The package in a venv that sees Debian's bcc, pinned exactly as the repository pins it: the
# agent and its commands only, since .dockerignore keeps kproxy_ebpf/dev (the lab and the benchmarks)
# out of the build context (`kproxy-ebpf lab` and `bench` then say they are not installed).
# Behind a TLS-intercepting proxy, pass its CA bundle as the build secret "ca-bundle" (it is
# used for pip only and never stored in a layer).
COPY pyproject.toml constraints.txt README.md /src/
COPY kproxy_ebpf /src/kproxy_ebpf
RUN --mount=type=secret,id=ca-bundle set -eux; \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi; \
    python3 -m venv --system-site-packages /opt/kproxy-ebpf/venv; \
    /opt/kproxy-ebpf/venv/bin/pip install --no-cache-dir -q --disable-pip-version-check \
        -c /src/constraints.txt /src; \
    rm -rf /src; \
    ln -s /opt/kproxy-ebpf/venv/bin/kproxy-ebpf /usr/local/bin/kproxy-ebpf; \
    /opt/kproxy-ebpf/venv/bin/python -c 'import bcc, kproxy_ebpf.cli.main'
# datapath/paths.py looks for the C sources here when the package is not a source checkout.
COPY bpf /usr/share/kproxy-ebpf/bpf

ENTRYPOINT ["/opt/kproxy-ebpf/venv/bin/kproxy-ebpf", "run"]
