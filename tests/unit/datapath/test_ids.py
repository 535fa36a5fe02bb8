"""IdAllocator: 1..max, fresh ids first, freed ids reused oldest-first, restore from kernel."""
from __future__ import annotations

import random

import pytest

from kproxy_ebpf.datapath.maps.ids import IdAllocator, IdsExhausted


def test_fresh_ids_increase_from_one_and_acquire_is_idempotent():
    a = IdAllocator(10, "backends")
    assert [a.acquire(k) for k in "abc"] == [1, 2, 3]
    assert a.acquire("b") == 2
    assert len(a) == 3 and a.free == 7 and "a" in a and a.get("z") is None


def test_released_id_not_reused_while_fresh_ids_remain():
    a = IdAllocator(4)
    a.acquire("a"), a.acquire("b")
    assert a.release("a") == 1
    assert a.acquire("c") == 3
    assert a.acquire("d") == 4
    assert a.acquire("e") == 1          # wrap-around: only now the freed id


@pytest.mark.parametrize("release_order, want", [
    pytest.param("bac", [2, 1, 3], id="b-then-a-then-c"),
    pytest.param("cab", [3, 1, 2], id="c-then-a-then-b"),
])
def test_freed_ids_reused_oldest_first(release_order, want):
    a = IdAllocator(3)
    for k in "abc":
        a.acquire(k)
    for k in release_order:
        a.release(k)
    assert [a.acquire(k) for k in "xyz"] == want


def test_exhausted():
    a = IdAllocator(2, "services")
    a.acquire("a"), a.acquire("b")
    with pytest.raises(IdsExhausted, match="services: all 2 ids"):
        a.acquire("c")
    a.release("a")
    assert a.acquire("c") == 1


def test_release_unknown_is_noop():
    a = IdAllocator(2)
    assert a.release("nope") is None
    assert a.acquire("a") == 1


def test_restore_then_fresh_ids_continue_above_highest():
    a = IdAllocator(10)
    a.restore("x", 2)
    a.restore("y", 5)
    a.restore("y", 5)                    # idempotent
    assert a.get("x") == 2 and a.key_of(5) == "y"
    assert [a.acquire(k) for k in "abcdefgh"] == [6, 7, 8, 9, 10, 1, 3, 4]
    with pytest.raises(IdsExhausted):
        a.acquire("i")


@pytest.mark.parametrize("setup, key, id_", [
    pytest.param([], "x", 0, id="zero-invalid"),
    pytest.param([], "x", 11, id="above-max"),
    pytest.param([("y", 3)], "x", 3, id="id-held-by-other-key"),
    pytest.param([("x", 3)], "x", 4, id="key-holds-other-id"),
])
def test_restore_rejects(setup, key, id_):
    a = IdAllocator(10)
    for k, i in setup:
        a.restore(k, i)
    with pytest.raises(ValueError):
        a.restore(key, id_)


def test_max_id_must_be_positive():
    with pytest.raises(ValueError):
        IdAllocator(0)


def test_random_ops_match_fifo_model():
    """Against a reference: fresh ids ascending, then freed ids in release order; never 0."""
    rng = random.Random(7)
    a, max_id = IdAllocator(20), 20
    fresh, freed, held = list(range(1, max_id + 1)), [], {}
    for step in range(2000):
        if held and rng.random() < 0.45:
            key = rng.choice(sorted(held))
            assert a.release(key) == held[key]
            freed.append(held.pop(key))
        else:
            key = f"k{step}"
            if not fresh and not freed:
                with pytest.raises(IdsExhausted):
                    a.acquire(key)
                continue
            want = fresh.pop(0) if fresh else freed.pop(0)
            assert a.acquire(key) == want
            held[key] = want
    assert sorted(held.values()) == sorted(i for _, i in a)


def test_restoring_a_high_id_does_not_list_the_ids_below_it():
    """A long-lived cluster's backend ids only grow; an agent restart must not pay for them."""
    from kproxy_ebpf.datapath.maps.ids import IdAllocator
    a = IdAllocator(2**31, "backends")
    a.restore("old", 3_000_000)
    assert a.acquire("new") == 3_000_001
    assert len(a._freed) == 0


def test_after_wrap_around_skipped_ids_are_found():
    from kproxy_ebpf.datapath.maps.ids import IdAllocator
    a = IdAllocator(5)
    a.restore("x", 4)
    assert [a.acquire(k) for k in "ab"] == [5, 1]   # cursor at the end, then the skipped ids
