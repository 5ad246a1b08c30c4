"""Duplicate detection per (source, incarnation): `SeqWindow` in wan/delivery.py.

Reliable sequence numbers start at 1; `seen_before` answers False exactly once per number.
"""

from __future__ import annotations

import random

from wan.delivery import SeqWindow


def test_in_order_sequences_are_new_and_compact_into_the_low_mark() -> None:
    w = SeqWindow()
    assert [w.seen_before(s) for s in range(1, 11)] == [False] * 10
    assert w.low == 10
    assert w.above == set()


def test_in_order_repeat_is_a_duplicate() -> None:
    w = SeqWindow()
    assert w.seen_before(1) is False
    assert w.seen_before(1) is True
    assert w.seen_before(2) is False
    assert w.seen_before(1) is True
    assert w.seen_before(2) is True


def test_out_of_order_sequences_are_new_and_held_until_the_gap_fills() -> None:
    w = SeqWindow()
    assert w.seen_before(3) is False
    assert w.seen_before(5) is False
    assert (w.low, w.above) == (0, {3, 5})
    assert w.seen_before(1) is False
    assert (w.low, w.above) == (1, {3, 5})
    assert w.seen_before(2) is False  # fills the gap: 1..3 are now contiguous
    assert (w.low, w.above) == (3, {5})
    assert w.seen_before(4) is False
    assert (w.low, w.above) == (5, set())


def test_duplicates_are_detected_above_and_below_the_low_mark() -> None:
    w = SeqWindow()
    for s in (1, 2, 7):
        assert w.seen_before(s) is False
    assert w.seen_before(7) is True  # held above the low mark
    assert w.seen_before(2) is True  # below the low mark
    assert w.seen_before(1) is True
    assert (w.low, w.above) == (2, {7})  # duplicates change nothing


def test_sequence_zero_is_at_or_below_the_low_mark() -> None:
    # 0 marks unreliable messages, which the node never de-duplicates; the window treats it as seen.
    assert SeqWindow().seen_before(0) is True


def test_shuffled_stream_with_retransmissions_accepts_each_number_once() -> None:
    rng = random.Random(0)
    n = 500
    stream = list(range(1, n + 1)) + [rng.randint(1, n) for _ in range(300)]  # originals + retransmits
    rng.shuffle(stream)
    w = SeqWindow()
    accepted = [s for s in stream if not w.seen_before(s)]
    assert sorted(accepted) == list(range(1, n + 1))
    # first occurrence of each number is the one accepted
    first: dict[int, int] = {}
    for i, s in enumerate(stream):
        first.setdefault(s, i)
    assert accepted == sorted(first, key=first.__getitem__)
    assert (w.low, w.above) == (n, set())


def test_windows_are_independent() -> None:
    a, b = SeqWindow(), SeqWindow()
    assert a.seen_before(1) is False
    assert b.seen_before(1) is False  # e.g. a restarted peer's new incarnation
