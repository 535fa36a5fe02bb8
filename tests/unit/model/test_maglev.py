"""The Maglev table (kproxy_ebpf/model/maglev.py): balance, disruption on a change, independence
from the order the backends come in, sizes; the flow hash's own properties (its agreement with
bpf/lib/maglev.h is tests/datapath/test_maglev_run.py's)."""
import random
from collections import Counter

import pytest

from kproxy_ebpf.model import maglev


def backends(n: int, port: int = 8080) -> list[tuple[str, int]]:
    return [(f"10.244.{i // 250}.{i % 250 + 1}", port) for i in range(n)]


def names(table: list[int], bs: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [bs[i] for i in table]


@pytest.mark.parametrize("n,size", [(1, 251), (3, 251), (10, 16381), (100, 16381),
                                    (7, 65521)])
def test_every_backend_holds_its_share_within_one_entry(n, size):
    counts = Counter(maglev.build(backends(n), size))
    assert len(counts) == n
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(counts.values()) == size


def test_the_table_does_not_depend_on_the_order_the_backends_come_in():
    bs = backends(10)
    shuffled = bs[:]
    random.Random(1).shuffle(shuffled)
    assert names(maglev.build(bs, 4093), bs) == names(maglev.build(shuffled, 4093), shuffled)


def test_the_port_is_part_of_a_backends_name():
    a, b = backends(5, 8080), backends(5, 9090)
    assert names(maglev.build(a, 4093), a) != [(ip, 8080) for ip, _ in
                                               names(maglev.build(b, 4093), b)]


@pytest.mark.parametrize("n", [2, 5, 10, 50, 300])
def test_removing_one_backend_moves_at_most_its_share_plus_one_percent(n):
    bs = backends(n)
    size = maglev.table_size(maglev.DEFAULT_SIZE, n)
    before = names(maglev.build(bs, size), bs)
    gone = bs[n // 2]
    rest = [b for b in bs if b != gone]
    after = names(maglev.build(rest, size), rest)
    moved = sum(1 for x, y in zip(before, after, strict=True) if x != y) / size
    own = before.count(gone) / size
    assert moved <= 1 / n + 0.01
    assert moved >= own            # its own entries move, of course
    # every entry of a surviving backend that moved went to another survivor
    assert all(y in rest for y in after)


@pytest.mark.parametrize("n", [2, 9, 49])
def test_adding_one_backend_moves_at_most_its_share_plus_one_percent(n):
    bs = backends(n + 1)
    size = maglev.table_size(maglev.DEFAULT_SIZE, n + 1)
    before = names(maglev.build(bs[:n], size), bs[:n])
    after = names(maglev.build(bs, size), bs)
    moved = sum(1 for x, y in zip(before, after, strict=True) if x != y) / size
    assert moved <= 1 / (n + 1) + 0.01


def test_sizes_are_primes_that_give_each_backend_a_hundred_entries():
    assert maglev.table_size(16381, 10) == 16381
    assert maglev.table_size(251, 10) == 10007           # the smallest prime >= 10,000
    assert maglev.table_size(16381, 20) == 20011         # >= 20,000
    assert maglev.table_size(16381, 200) == maglev.MAX_SIZE
    for n in (3, 17, 65):
        size = maglev.table_size(251, n)
        assert maglev.is_prime(size) and size >= n * maglev.ENTRIES_PER_BACKEND
    assert maglev.validate_size(16381) is None
    assert "prime" in maglev.validate_size(16384)
    assert "between" in maglev.validate_size(65537)


def test_no_backend_no_table():
    assert maglev.build([], 251) == []


def test_flow_hash_spreads_and_is_stable():
    h = maglev.flow_hash("192.0.2.7", 40000, 30080, 6)
    assert h == maglev.flow_hash("192.0.2.7", 40000, 30080, 6)
    assert h != maglev.flow_hash("192.0.2.7", 40001, 30080, 6)
    assert h != maglev.flow_hash("192.0.2.7", 40000, 30080, 17)
    assert h != maglev.flow_hash("2001:db8::7", 40000, 30080, 6)
    # consecutive source ports land evenly over 16381 entries: chi-square over 16 buckets
    buckets = Counter(maglev.flow_hash("192.0.2.7", p, 30080, 6) % 16381 * 16 // 16381
                      for p in range(1024, 1024 + 32000))
    expected = 32000 / 16
    chi2 = sum((c - expected) ** 2 / expected for c in buckets.values())
    assert chi2 < 37.7          # p = 0.001 at 15 degrees of freedom


def test_the_constants_are_the_headers():
    """The table's largest size and the flow hash's seed are kproxy.h's (the generated table
    of its constants): the agent's tables and the programs' lookups must agree on both."""
    from kproxy_ebpf.datapath.maps import layout as L

    assert maglev.MAX_SIZE == L.const("KP_MAGLEV_MAX")
    assert maglev.SEED == L.const("KP_MAGLEV_SEED")
