"""The scheduler bench's figures, goals and page (schedulers.py): pure functions of the
results document, so every number on the page is one the run produced.

Each figure is the median over the rounds; the goals compare an algorithm with random round
by round (both ran within the same minutes), so the machine's drift between rounds cancels."""
from __future__ import annotations

from .goals import MET, MISSED, NOT_MEASURED
from .stats import median

BASE = "random"
COST_MARGIN = 0.10      # issue 46: no algorithm's connect cost more than 10 % above random's
CONNECT, RELEASE = "kp_connect4", "kp_release"


def _runs(doc: dict, algorithm: str) -> list[dict]:
    return [r[algorithm] for r in doc.get("rounds", []) if algorithm in r]


def algorithms(doc: dict) -> list[str]:
    seen: list[str] = []
    for r in doc.get("rounds", []):
        seen += [a for a in r if a not in seen]
    return sorted(seen, key=lambda a: (a != BASE, seen.index(a)))


def _med(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return round(median(vals), 3) if vals else None


def _ns(run: dict, key: str, prog: str) -> float | None:
    return (run.get(key) or {}).get(prog, {}).get("ns")


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: round(v / total, 4) for k, v in sorted(counts.items())} if total else {}


def summary(doc: dict) -> dict[str, dict]:
    """Per algorithm: the slow-backend case (p50/p99 ms, the backends' shares of all rounds'
    connections), M1/M2 and the programs' ns per run, each the median over the rounds."""
    out = {}
    for a in algorithms(doc):
        runs = _runs(doc, a)
        counts: dict[str, int] = {}
        for r in runs:
            for name, n in r["slow"]["backends"].items():
                counts[name] = counts.get(name, 0) + n
        out[a] = {
            "rounds": len(runs),
            "p50_ms": _med([r["slow"]["latency_ms"].get("p50") for r in runs]),
            "p99_ms": _med([r["slow"]["latency_ms"].get("p99") for r in runs]),
            "p99_ms_rounds": [r["slow"]["latency_ms"].get("p99") for r in runs],
            "rate": _med([r["slow"]["rate"] for r in runs]),
            "failed": sum(r["slow"]["failed"] for r in runs),
            "shares": shares(counts),
            "connect_p50_us": _med([r["M1"]["connect_us"].get("p50") for r in runs]),
            "connect_p99_us": _med([r["M1"]["connect_us"].get("p99") for r in runs]),
            "rate_1": _med([r["M2"]["rate_1"] for r in runs]),
            "rate_2": _med([r["M2"]["rate_2"] for r in runs]),
            "crr_failed": sum(r["M2"]["failed"] for r in runs),
            "connect_ns": _med([_ns(r, "bpf_ns", CONNECT) for r in runs]),
            "release_ns": _med([_ns(r, "bpf_ns", RELEASE) for r in runs]),
        }
    return out


def paired(doc: dict, algorithm: str, get) -> list[tuple[float, float]]:
    """(algorithm's, random's) value of each round both ran in, where both have one."""
    out = []
    for r in doc.get("rounds", []):
        if algorithm in r and BASE in r:
            a, b = get(r[algorithm]), get(r[BASE])
            if a is not None and b is not None:
                out.append((a, b))
    return out


def cost_blocks(doc: dict) -> list[tuple[int, dict[str, float]]]:
    """The interleaved cost runs (schedulers.SchedRun.interleaved_cost) as blocks of one run
    per algorithm through Services of the same size, run back to back: (backends,
    {algorithm: kp_connect4 ns})."""
    blocks: list[tuple[int, dict[str, float]]] = []
    for r in doc.get("rounds", []):
        for run in r.values():
            for c in run.get("interleaved_cost", []):
                ns = c["bpf_ns"].get(CONNECT, {}).get("ns")
                if (not blocks or blocks[-1][0] != c["backends"]
                        or c["algorithm"] in blocks[-1][1]):
                    blocks.append((c["backends"], {}))
                if ns is not None:
                    blocks[-1][1][c["algorithm"]] = ns
    return blocks


def interleaved_cost(doc: dict) -> dict[int, dict[str, dict]]:
    """{backends: {algorithm: {"ns": median, "ratio": median of its ratios to random's run
    in the same block, "blocks": n}}}."""
    per: dict[int, dict[str, dict]] = {}
    for e, block in cost_blocks(doc):
        base = block.get(BASE)
        for a, ns in block.items():
            row = per.setdefault(e, {}).setdefault(a, {"ns": [], "ratios": []})
            row["ns"].append(ns)
            if base:
                row["ratios"].append(ns / base)
    return {e: {a: {"ns": _med(row["ns"]), "blocks": len(row["ns"]),
                    "ratio": round(median(row["ratios"]), 4) if row["ratios"] else None}
                for a, row in sorted(rows.items(), key=lambda kv: kv[0] != BASE)}
            for e, rows in sorted(per.items(), reverse=True)}


def goals(doc: dict) -> list[dict]:
    out = []

    def add(goal: str, status: str, measured: str) -> None:
        out.append({"metric": "sched", "goal": goal, "status": status, "measured": measured})

    p99 = paired(doc, "least-conn", lambda run: run["slow"]["latency_ms"].get("p99"))
    goal = "slow-backend case: least-conn's p99 below random's (in every round)"
    if not p99:
        add(goal, NOT_MEASURED, "needs random and least-conn in one round")
    else:
        below = sum(a < b for a, b in p99)
        add(goal, MET if below == len(p99) else MISSED,
            f"below in {below} of {len(p99)} rounds: " + ", ".join(
                f"{a:.1f} vs {b:.1f} ms" for a, b in p99))
    for e, rows in interleaved_cost(doc).items():
        for a, row in rows.items():
            if a == BASE:
                continue
            goal = (f"{a}: connect cost (kp_connect4, {e} backends) <= "
                    f"{1 + COST_MARGIN:.2f} x random's")
            if row["ratio"] is None:
                add(goal, NOT_MEASURED, "needs random's run beside it")
                continue
            add(goal, MET if row["ratio"] <= 1 + COST_MARGIN else MISSED,
                f"{row['ratio']:.3f}x ({row['ns']:.0f} ns against {rows[BASE]['ns']:.0f} ns; "
                f"median over {row['blocks']} interleaved runs)" if BASE in rows else
                f"{row['ratio']:.3f}x")
    return out


def _c(v, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def markdown(doc: dict, env_lines: list[str]) -> str:
    cfg = doc.get("config", {})
    summ = summary(doc)
    delays = doc.get("delays_us") or {}
    names = sorted(delays) or sorted({b for s in summ.values() for b in s["shares"]})
    slow = doc.get("slow_backend")
    heads = [f"{n} ({delays.get(n, '?')} us{', slow' if n == slow else ''})" for n in names]
    lines = [
        "# Schedulers: random, round robin, least connection (issue 46)", "",
        "Generated by `kproxy-ebpf bench --schedulers` (`make schedulers`; raw figures in "
        "schedulers-latest.json). kproxy on node1 was started with `--lb-algorithm` set to "
        f"each algorithm in turn, {cfg.get('rounds')} rounds, the order rotated each round; "
        "every figure is the median over the rounds"
        + (" (`--quick` settings)." if cfg.get("quick") else "."),
        "Maglev is not a row: on the socket path it picks at random like `random` (its "
        "tables serve flows from outside at TC).", ""]
    lines += env_lines
    lines += [
        "", "## Slow-backend case", "",
        f"`{doc.get('service', 'kpbench-sched')}`: three backends with one worker each, "
        "served one request at a time; the slow one takes ten times longer per request. "
        f"{cfg.get('threads')} closed-loop clients in a pod of node1 open one connection per "
        f"request for {cfg.get('seconds')} s. Latency: from connect to the reply. Shares: of "
        "the connections of all rounds.", "",
        "| algorithm | p50 (ms) | p99 (ms) | p99 per round (ms) | "
        + " | ".join(f"share {h}" for h in heads) + " | requests/s | failed |",
        "|---" * (6 + len(heads)) + "|"]
    for a, s in summ.items():
        lines.append(
            f"| {a} | {_c(s['p50_ms'])} | {_c(s['p99_ms'])} | "
            + ", ".join(_c(v, "{:.1f}") for v in s["p99_ms_rounds"]) + " | "
            + " | ".join(_c(s["shares"].get(n), "{:.1%}") for n in names)
            + f" | {_c(s['rate'], '{:.0f}')} | {s['failed']} |")
    cost = interleaved_cost(doc)
    sizes = list(cost)
    lines += [
        "", "## Cost on the socket path", "",
        f"M1/M2 as the main bench measures them (crr through `kpbench-target`, "
        f"{cfg.get('endpoints')} backends, the node-wide algorithm; {cfg.get('m1_runs')} runs "
        f"with 1 thread and {cfg.get('m2_runs')} with 2 per start). The connect cost is the "
        "kernel's mean run time of kp_connect4 per connect (bpf_stats): first over one crr run "
        "through the target (node-wide), with kp_release per socket closed beside it, then "
        "interleaved: Services annotated with each algorithm, over the same pods, run back to "
        f"back {cfg.get('cost_pairs')} times per start; \"vs random\" is the median of the "
        "ratios to random's run in the same block, which the minute-to-minute drift of a "
        "shared machine does not reach.", "",
        "| algorithm | M1 connect p50 (us) | M1 connect p99 (us) | M2 1 thread (/s) | "
        "M2 2 threads (/s) | kp_connect4 node-wide (ns) | kp_release (ns) | "
        + " | ".join(f"kp_connect4 {e} backends, interleaved (ns) | vs random" for e in sizes)
        + " |",
        "|---" * (7 + 2 * len(sizes)) + "|"]
    for a, s in summ.items():
        cells = []
        for e in sizes:
            row = cost[e].get(a, {})
            cells += [_c(row.get("ns"), "{:.0f}"), _c(row.get("ratio"), "{:.3f}x")]
        lines.append(
            f"| {a} | {_c(s['connect_p50_us'])} | {_c(s['connect_p99_us'])} | "
            f"{_c(s['rate_1'], '{:.0f}')} | {_c(s['rate_2'], '{:.0f}')} | "
            f"{_c(s['connect_ns'], '{:.0f}')} | {_c(s['release_ns'], '{:.0f}')} | "
            + " | ".join(cells) + " |")
    lines += ["", "## Goals (issue 46)", "", "| goal | status | measured |", "|---|---|---|"]
    for g in doc.get("goals", []):
        mark = {MET: "**met**", MISSED: "**missed**"}.get(g["status"], g["status"])
        lines.append(f"| {g['goal']} | {mark} | {g['measured']} |")
    return "\n".join(lines) + "\n"
