"""The change-cost run's goals and page (change_cost.py): pure functions of the results
document, so every figure on the page is one the run produced."""
from __future__ import annotations

from .goals import MET, MISSED, NOT_MEASURED

OURS, BASE = "kproxy", "nftables"
PATTERNS = ("paced", "bursts")
SPREAD = 0.2            # the goal: within 20 % between the fewest and the most pods


def _ms(results: dict, mode: str, n: str, density: str, pattern: str) -> dict | None:
    return results.get(mode, {}).get(n, {}).get(density, {}).get(pattern)


def _keys(results: dict) -> tuple[list[str], list[str]]:
    ns = sorted({n for r in results.values() for n in r}, key=int)
    dens = sorted({d for r in results.values() for per in r.values() for d in per}, key=int)
    return ns, dens


def goals(doc: dict) -> list[dict]:
    res = doc.get("results", {})
    ns, dens = _keys(res)
    out = []

    def add(goal: str, status: str, measured: str) -> None:
        out.append({"metric": "change", "goal": goal, "status": status, "measured": measured})

    for n in ns:
        for pattern in PATTERNS:
            for d in dens:
                ours, base = _ms(res, OURS, n, d, pattern), _ms(res, BASE, n, d, pattern)
                goal = f"CPU per change <= 1.0x nftables at N={n}, {d} pods, {pattern}"
                if not ours or not base or base["ms_per_change"] <= 0:
                    add(goal, NOT_MEASURED, "needs both modes")
                    continue
                ratio = ours["ms_per_change"] / base["ms_per_change"]
                add(goal, MET if ratio <= 1.0 else MISSED,
                    f"{ours['ms_per_change']:.2f} ms against {base['ms_per_change']:.2f} ms "
                    f"({ratio:.2f}x)")
            per = [(d, _ms(res, OURS, n, d, pattern)) for d in dens]
            per = [(d, r["ms_per_change"]) for d, r in per if r]
            goal = f"kproxy within 20 % between {dens[0]} and {dens[-1]} pods, N={n}, {pattern}"
            if len(per) < 2 or per[0][1] <= 0:
                add(goal, NOT_MEASURED, "needs two densities")
                continue
            rel = (per[-1][1] - per[0][1]) / per[0][1]
            add(goal, MET if abs(rel) <= SPREAD else MISSED,
                f"{per[0][1]:.2f} ms with {per[0][0]} pods, {per[-1][1]:.2f} ms with "
                f"{per[-1][0]} ({rel * 100:+.0f} %)")
    return out


def markdown(doc: dict, env_lines: list[str]) -> str:
    res, cfg = doc.get("results", {}), doc.get("config", {})
    ns, dens = _keys(res)
    modes = [m for m in (OURS, BASE) if m in res] + sorted(set(res) - {OURS, BASE})
    lines = ["# CPU per endpoint change, by pods on the node", "",
             f"`make change-cost` (kproxy-ebpf bench --change-cost): node1's proxy, {cfg.get('changes')} "
             f"changes per window at {cfg.get('rate')}/s, one at a time (paced) or "
             f"{cfg.get('burst')} at once (bursts); each moves one endpoint of a filler "
             "Service (a backend removed, one added). CPU of the proxy's cgroup (children "
             "included), its own periodic syncs and the idle rate taken out, per change: the "
             "median over the window's sub-windows, min..max beside.", "", *env_lines, "",
             "| N | pods | pattern | " + " | ".join(f"{m} ms/change" for m in modes)
             + f" | {OURS} / {BASE} |", "|" + "---|" * (4 + len(modes))]
    for n in ns:
        for d in dens:
            for pattern in PATTERNS:
                cells = []
                for m in modes:
                    r = _ms(res, m, n, d, pattern)
                    cells.append("–" if not r else
                                 f"{r['ms_per_change']:.2f} ({r['ms_min']:.2f}..{r['ms_max']:.2f})")
                ours, base = _ms(res, OURS, n, d, pattern), _ms(res, BASE, n, d, pattern)
                ratio = (f"{ours['ms_per_change'] / base['ms_per_change']:.2f}x"
                         if ours and base and base["ms_per_change"] > 0 else "–")
                lines.append(f"| {n} | {d} | {pattern} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", "| N | pods | " + " | ".join(f"{m} idle mCPU, RSS MiB" for m in modes) + " |",
              "|" + "---|" * (2 + len(modes))]
    for n in ns:
        for d in dens:
            cells = []
            for m in modes:
                r = res.get(m, {}).get(n, {}).get(d)
                cells.append("–" if not r else f"{r['idle_mcpu']}, {r['rss_mib']}")
            lines.append(f"| {n} | {d} | " + " | ".join(cells) + " |")
    hooks = [m for m in modes if m.startswith(OURS)]
    lines += ["", "The socket hooks' own cost per connect (bpf_stats run time of kp_connect4 "
              "over a crr run through a ClusterIP, after programming; ns):", "",
              "| N | pods | " + " | ".join(hooks) + " |", "|" + "---|" * (2 + len(hooks))]
    for n in ns:
        for d in dens:
            cells = []
            for m in hooks:
                c = (res.get(m, {}).get(n, {}).get(d) or {}).get("connect", {}).get("kp_connect4")
                cells.append("–" if not c else f"{c['ns']:.0f} ({c['runs']} runs)")
            lines.append(f"| {n} | {d} | " + " | ".join(cells) + " |")
    lines += ["", "## Goals", "", "| goal | status | measured |", "|---|---|---|"]
    lines += [f"| {g['goal']} | {g['status']} | {g['measured']} |" for g in doc.get("goals", [])]
    return "\n".join(lines) + "\n"
