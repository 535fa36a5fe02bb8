"""Pure statistics for the benchmark: percentiles, the median over repeated runs, ratios, and
the chi-square test of how evenly connections spread over backends (M10). No I/O."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

PERCENTILE_KEYS = ("p50", "p90", "p99", "p999")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (the same definition as the C client's)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(p / 100.0 * len(ordered))))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median: the order statistics k and
    n+1-k, k the largest rank whose binomial(n, 1/2) tails leave at least `level` between
    them (the sign test's interval; no assumption about the runs' distribution). None when
    there are too few values for that level (n < 6 at 95 %)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 0
    for j in range(1, n // 2 + 1):
        # P(X < j) for X ~ Binomial(n, 1/2): the chance the median lies below the j-th value
        tail = sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if 1 - 2 * tail < level:
            break
        k = j
    return (ordered[k - 1], ordered[n - k]) if k else None


def median_of_runs(runs: Sequence[Mapping[str, float]],
                   keys: Sequence[str] = PERCENTILE_KEYS) -> dict[str, float]:
    """Each key's median over runs (performance.md: report each percentile as the median of
    >= 5 runs, so one disturbed run on a shared machine does not make the figure)."""
    return {k: median(r[k] for r in runs) for k in keys if runs and all(k in r for r in runs)}


def ratio(ours: float | None, base: float | None) -> float | None:
    """ours / base, or None when either is missing or the base is zero."""
    if ours is None or base is None or base == 0:
        return None
    return ours / base


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for a chi-square variable with `dof` degrees of freedom: the regularised
    upper incomplete gamma Q(dof/2, x/2), by its series (x small) or continued fraction."""
    if dof < 1:
        raise ValueError("dof must be >= 1")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    lg = math.lgamma(a)
    if z < a + 1:           # series for the lower function P, then Q = 1 - P
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - lg))
    # Lentz's continued fraction for Q
    tiny = 1e-300
    b = z + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, h * math.exp(-z + a * math.log(z) - lg))


def spread(counts: Mapping[str, int], expected_names: Sequence[str] | None = None) -> dict:
    """How evenly connections landed on backends: chi-square against uniform, its p-value,
    and the largest relative deviation of one backend from its fair share. Backends that
    should have been chosen but got nothing count as zero (pass expected_names)."""
    names = list(expected_names) if expected_names else sorted(counts)
    observed = [int(counts.get(n, 0)) for n in names]
    unexpected = sum(v for n, v in counts.items() if n not in names)
    total = sum(observed)
    k = len(observed)
    if k < 2 or total == 0:
        return {"connections": total, "backends": k, "chi2": None, "p_value": None,
                "max_deviation": None, "unexpected": unexpected}
    exp = total / k
    chi2 = sum((o - exp) ** 2 / exp for o in observed)
    return {"connections": total, "backends": k, "chi2": chi2, "p_value": chi2_sf(chi2, k - 1),
            "max_deviation": max(abs(o - exp) / exp for o in observed),
            "unexpected": unexpected}


def merge_counts(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in parts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + int(n)
    return out


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the values that are there, None if none is."""
    present = [v for v in values if v is not None]
    return median(present) if present else None
