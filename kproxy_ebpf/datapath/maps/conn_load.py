"""A kp_connload word (bpf/kproxy.h KP_LOAD_*): a least-conn counter's holder gen in the top
bits and its count (sockets plus flows open, before the agent's repair) plus a bias below,
so that one 8-byte word is all a connect reads of the counter."""
from __future__ import annotations

from . import layout as L

GEN_SHIFT = L.const("KP_LOAD_GEN_SHIFT")
BIAS = 1 << (GEN_SHIFT - 1)
_COUNT = (1 << GEN_SHIFT) - 1


def word(gen: int, count: int = 0) -> int:
    """The word of a counter held under `gen` (1..0xffff) with `count`."""
    return (gen << GEN_SHIFT) | (BIAS + count)


def count(w: int) -> int:
    """A word's count; 0 for a word never written (an index not handed out)."""
    return (w & _COUNT) - BIAS if w else 0


def gen(w: int) -> int:
    return w >> GEN_SHIFT
