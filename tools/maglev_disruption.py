"""How many flows a Maglev table moves when one of E backends leaves, beyond that backend's
own 1/E, for table sizes and backend counts (docs/measurements.md "Maglev"):
.venv/bin/python tools/maglev_disruption.py. Pure computation on kproxy_ebpf/model/maglev.py."""
from __future__ import annotations

from kproxy_ebpf.model import maglev

CASES = [(10, 1009), (10, 4093), (10, 16381), (50, 16381), (50, 65521), (100, 65521),
         (300, 65521), (650, 65521)]
TRIALS = 5


def backends(n: int, trial: int) -> list[tuple[str, int]]:
    return [(f"10.{trial}.{i // 250}.{i % 250 + 1}", 8080) for i in range(n)]


def excess(n: int, size: int, trial: int) -> float:
    bs = backends(n, trial)
    before = [bs[i] for i in maglev.build(bs, size)]
    gone = bs[(trial * 7) % n]
    rest = [b for b in bs if b != gone]
    after = [rest[i] for i in maglev.build(rest, size)]
    return sum(x != y for x, y in zip(before, after, strict=True)) / size - 1 / n


def main() -> None:
    print("| E | entries per backend | excess over 1/E |\n|---|---|---|")
    for n, size in CASES:
        worst = max(excess(n, size, t) for t in range(TRIALS))
        print(f"| {n} | {size // n} (size {size}) | {worst:.2%} |")


if __name__ == "__main__":
    main()
