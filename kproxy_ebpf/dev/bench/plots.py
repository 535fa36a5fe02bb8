"""PNG plots of each metric against N, one line per mode, so flatness (or its absence) is
seen rather than claimed. matplotlib with the Agg backend (no display)."""
from __future__ import annotations

from pathlib import Path

from . import goals

PLOTS = (
    ("m1_connect", "M1 connect latency through the ClusterIP", "us",
     ("m1_connect_p50", "m1_connect_p99")),
    ("m2_rate", "M2 new connections per second (1 client)", "conn/s", ("m2_rate_1",)),
    ("m5_change", "M5 one EndpointSlice change until a connection sees it", "ms",
     ("m5_p50", "m5_p99")),
    ("m6_cold", "M6 cold start until all N x E are programmed and answering", "s",
     ("m6_cold", "m6_first")),
    ("m7_rss", "M7 proxy resident memory (peak under churn)", "MiB", ("m7_rss",)),
    ("m7_cpu", "M7 proxy CPU at rest and under 100 changes/s (children included)", "mCPU",
     ("m7_steady", "m7_churn")),
    ("m8_p99", "M8 connect p99 during 50 changes/s", "us", ("m8_p99",)),
    ("m9_nodeport_crr", "M9 NodePort new connections/s from outside (node1 -> node2)",
     "conn/s", ("m9_crr_rate",)),
    ("m10_lookup", "M10 lookup cost: kernel run time per connect or packet (bpf_stats)",
     "ns", ("m10_connect4", "m10_connect4_miss", "m10_from_pod")),
)
# M9's rates at the largest N, one bar per mode (they are measured at that N only).
M9_BARS = (("m9_pps", "UDP packets forwarded/s"), ("m9_softirq", "softirq ns per packet"),
           ("m9_rr_rate", "TCP keepalive req/s"), ("m9_crr_rate", "TCP new conn/s"))
STYLE = {"direct": "k", "iptables": "tab:red", "iptables-legacy": "tab:purple",
         "nftables": "tab:orange", "kproxy": "tab:blue", "kproxy-tc": "tab:green",
         "kproxy-maglev": "tab:purple"}
LOG_Y = {"m5_change", "m6_cold", "m7_cpu"}
# Line labels where a plot has several figures and their labels' last word is not enough.
SHORT = {"m10_connect4": "kp_connect4, Service", "m10_connect4_miss": "kp_connect4, pod IP",
         "m10_from_pod": "kp_from_pod per packet, Service"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bench_plots(doc: dict, out_dir: Path) -> list[Path]:
    ns = goals.sizes(doc)
    if not ns:
        return []
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, unit, keys in PLOTS:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
        drew = False
        for mode, color in STYLE.items():
            # strict=False: a plot has up to three keys, each takes the next dash.
            for key, dash in zip(keys, ("-", "--", ":"), strict=False):
                pts = [(n, goals.value(doc, mode, n, key)) for n in ns]
                pts = [(n, v) for n, v in pts if isinstance(v, (int, float))]
                if not pts:
                    continue
                label = mode if len(keys) == 1 else \
                    f"{mode} {SHORT.get(key) or goals.FIGURE_BY_KEY[key].label.split()[-1]}"
                ax.plot([p[0] for p in pts], [p[1] for p in pts], dash, color=color,
                        marker="o", label=label)
                drew = True
        if not drew:
            plt.close(fig)
            continue
        ax.set_xscale("log")
        if name in LOG_Y:
            ax.set_yscale("log")
        ax.set_xlabel("Services (N), 10 endpoints each")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    m9 = m9_plot(doc, out_dir, plt)
    return written + ([m9] if m9 else [])


def m9_plot(doc: dict, out_dir: Path, plt) -> Path | None:
    """M9 at the largest N: one panel per figure, one bar per mode."""
    n = goals.sizes(doc)[-1]
    panels = []
    for key, title in M9_BARS:
        bars = [(m, goals.value(doc, m, n, key)) for m in STYLE]
        bars = [(m, v) for m, v in bars if isinstance(v, (int, float))]
        if bars:
            panels.append((title, bars))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.6), dpi=100,
                             squeeze=False)
    for ax, (title, bars) in zip(axes[0], panels, strict=True):
        ax.bar(range(len(bars)), [v for _m, v in bars], color=[STYLE[m] for m, _v in bars])
        ax.set_xticks(range(len(bars)), [m for m, _v in bars], rotation=30, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"M9 NodePort from outside, N = {n} Services", fontsize=10)
    fig.tight_layout()
    path = out_dir / "m9_nodeport.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def scale_plot(doc: dict, out_dir: Path) -> Path | None:
    """CPU per single endpoint change against N, one line per proxy (issue 11)."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    drew = False
    for mode, per in doc.get("results", {}).items():
        pts = sorted((int(n), v.get("cpu_ms_per_change")) for n, v in
                     per.get("per_change", {}).items())
        pts = [(n, v) for n, v in pts if isinstance(v, (int, float))]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o",
                    color=STYLE.get(mode), label=mode)
            drew = True
    if not drew:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Services (N), 10 endpoints each")
    ax.set_ylabel("CPU ms per endpoint change (children included)")
    ax.set_title("Scale run: CPU per single endpoint change", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "scale_cpu_per_change.png"
    fig.savefig(path)
    plt.close(fig)
    return path
