"""Reliable delivery to one peer (wan/reliable.py) on a virtual clock: sequence numbers, acks, the
resend rule, a stale-epoch notice, parked messages. Pure logic: no sockets, no clock."""

from __future__ import annotations

from wan.reliable import ReliableChannel

MS = 1_000_000
TIMEOUT = 500 * MS


def _sent(ch: ReliableChannel, now: int, *, epoch: int | None = 1, wire: int = 100, handed: bool = True) -> int:
    seq = ch.next_seq()
    ch.track(seq, [b"x"], "control", wire, now, epoch)
    if handed:
        ch.handed_over(seq)
    return seq


def test_sequence_numbers_start_at_one_and_only_rise():
    ch = ReliableChannel()
    assert [ch.next_seq() for _ in range(3)] == [1, 2, 3]


def test_nothing_outstanding_is_never_due():
    ch = ReliableChannel()
    assert ch.due(10**12, TIMEOUT) is None and ch.to_resend() == []


def test_no_ack_for_the_timeout_makes_everything_due_and_an_ack_restarts_the_clock():
    ch = ReliableChannel()
    a = _sent(ch, 0)
    b = _sent(ch, 100 * MS)
    assert ch.due(TIMEOUT, TIMEOUT) is None  # exactly the timeout: not yet
    assert ch.due(TIMEOUT + 1, TIMEOUT) == "no ack progress for 500 ms"
    assert ch.on_ack(a, 400 * MS).frames == [b"x"]
    assert ch.due(TIMEOUT + 1, TIMEOUT) is None  # progress at 400 ms
    assert ch.due(900 * MS + 1, TIMEOUT) == "no ack progress for 500 ms"
    assert [p.first_sent_ns for p in ch.to_resend()] == [100 * MS] and ch.outstanding() == 1
    assert ch.on_ack(a, 950 * MS) is None  # a duplicate ack changes nothing
    assert ch.on_ack(b, 960 * MS) is not None and ch.outstanding() == 0 and ch.due(10**12, TIMEOUT) is None


def test_a_lost_message_behind_newer_acks_is_due_although_acks_keep_coming():
    """Acks arrive in order on one connection: a newer one acked while an older one waits the timeout
    means the older one (or its ack) was lost; a steady flow of acks must not hide it."""
    ch = ReliableChannel()
    lost = _sent(ch, 0)
    for t in range(1, 12):  # a newer message every 100 ms, each acked at once
        s = _sent(ch, t * 100 * MS)
        ch.on_ack(s, t * 100 * MS + MS)
        if t * 100 * MS + MS <= TIMEOUT:
            assert ch.due(t * 100 * MS + MS, TIMEOUT) is None
    assert ch.due(1_101 * MS, TIMEOUT) == "unacked for 500 ms while a message sent after it was acked"
    [p] = ch.to_resend()
    assert ch.resent(p, 1_102 * MS) is True  # handed before: a resend
    ch.restart_clock(1_102 * MS)
    assert ch.due(1_103 * MS, TIMEOUT) is None  # its last send is fresh again
    assert ch.on_ack(lost, 1_200 * MS) is not None


def test_a_stale_epoch_notice_forgets_only_fenced_messages_of_earlier_epochs():
    ch = ReliableChannel()
    old = [_sent(ch, 0, epoch=3, wire=10), _sent(ch, 0, epoch=4, wire=20)]
    unfenced = _sent(ch, 0, epoch=None, wire=40)
    current = _sent(ch, 0, epoch=5, wire=80)
    assert ch.drop_superseded(5, 700 * MS) == (2, 30)
    assert list(ch.pending) == [unfenced, current] and ch.outstanding_bytes() == 120
    assert ch.due(1_199 * MS, TIMEOUT) is None  # the drop was progress
    assert ch.drop_superseded(5, 800 * MS) == (0, 0)
    assert all(s not in ch.pending for s in old)


def test_a_parked_message_goes_for_the_first_time_and_a_cutoff_resends_only_older_handed_ones():
    ch = ReliableChannel()
    handed_early = _sent(ch, 0)
    parked = _sent(ch, 50 * MS, handed=False)
    handed_late = _sent(ch, 300 * MS)
    assert (ch.parked(), ch.in_flight()) == (1, 2)
    assert [p for p in ch.to_resend(sent_before_ns=200 * MS)] == [ch.pending[handed_early]]
    everything = ch.to_resend()
    assert [ch.resent(p, 400 * MS) for p in everything] == [True, False, True]  # the parked one: a first send
    assert (ch.parked(), ch.in_flight()) == (0, 3)
    assert {ch.pending[s].last_sent_ns for s in (handed_early, parked, handed_late)} == {400 * MS}


def test_a_destination_over_its_cap_is_named_with_the_bound_it_passed():
    ch = ReliableChannel()
    assert ch.over(2, 1000) is None
    a = _sent(ch, 0, wire=600)
    assert ch.over(2, 1000) is None and ch.outstanding_bytes() == 600
    _sent(ch, 0, wire=500)
    assert ch.over(3, 1000) == "1,100 unacked bytes (at most 1,000)"
    assert ch.over(2, 10_000) == "2 unacked messages (at most 2)"
    ch.on_ack(a, MS)
    assert ch.over(2, 1000) is None and ch.outstanding_bytes() == 500
    _sent(ch, 0, epoch=0, wire=10)
    assert ch.drop_superseded(1, 2 * MS) == (1, 10) and ch.outstanding_bytes() == 500
