"""The inbox is fair across sources (issue 54): a member that floods fills only its own share of a
node's inbox and is served in turn with the others, so another member's heartbeat is neither dropped
nor queued behind the flood. Pure logic: messages built in memory, no sockets."""

from __future__ import annotations

import queue

import pytest

from wan.delivery import Inbox
from wan.frames import Message


def msg(src: str, i: int, wire_bytes: int = 100, kind: str = "heartbeat") -> Message:
    return Message(kind=kind, cls="control", run="r", epoch=1, step=0, src=src, inc=1, seq=i + 1,
                   body={"i": i}, wire_bytes=wire_bytes)


def drain(inbox: Inbox) -> list[tuple[str, int]]:
    out = []
    while True:
        try:
            m = inbox.get_nowait()
        except queue.Empty:
            return out
        out.append((m.src, m.body["i"]))


def test_a_flooding_member_fills_only_its_share_and_the_others_heartbeats_still_fit() -> None:
    inbox = Inbox(max_messages=40, max_bytes=1 << 20)
    accepted = [inbox.offer(msg("evil", i)) for i in range(40)]
    assert accepted == [True] * 10 + [False] * 30  # a quarter of 40
    assert inbox.offer(msg("a", 0)) and inbox.offer(msg("b", 0))
    assert inbox.qsize() == 12 and inbox.nbytes == 1200
    with inbox.mutex:
        assert inbox.full_for(msg("evil", 99)) == "source evil's share"
        assert inbox.full_for(msg("c", 0)) is None


def test_sources_are_served_in_turn_each_in_its_own_order() -> None:
    inbox = Inbox(max_messages=400, max_bytes=1 << 20)
    for i in range(5):
        inbox.offer(msg("evil", i))
    inbox.offer(msg("a", 0))
    inbox.offer(msg("b", 0))
    inbox.offer(msg("a", 1))
    # the flood's first message came first; a's and b's heartbeats come next, not after the flood
    assert drain(inbox) == [("evil", 0), ("a", 0), ("b", 0), ("evil", 1), ("a", 1), ("evil", 2), ("evil", 3),
                            ("evil", 4)]
    assert inbox.qsize() == 0 and inbox.nbytes == 0


def test_a_source_is_bounded_in_bytes_too() -> None:
    inbox = Inbox(max_messages=1000, max_bytes=1000)  # one source: at most half the bytes
    assert [inbox.offer(msg("donor", i, wire_bytes=200)) for i in range(4)] == [True, True, False, False]
    assert inbox.offer(msg("a", 0, wire_bytes=200))
    assert drain(inbox) == [("donor", 0), ("a", 0), ("donor", 1)]
    # emptied: the donor's share is free again
    assert inbox.offer(msg("donor", 9, wire_bytes=500)) and inbox.nbytes == 500


def test_the_whole_inbox_limit_still_holds_across_many_sources() -> None:
    inbox = Inbox(max_messages=8, max_bytes=1 << 20)
    ok = [inbox.offer(msg(f"s{i}", 0)) for i in range(12)]
    assert ok == [True] * 8 + [False] * 4
    with inbox.mutex:
        assert inbox.full_for(msg("s99", 0)) == "inbox"


@pytest.mark.parametrize("blocking", [True, False])
def test_get_with_and_without_timeout_behaves_as_a_queue(blocking: bool) -> None:
    inbox = Inbox(max_messages=4, max_bytes=1 << 20)
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.01) if blocking else inbox.get_nowait()
    inbox.offer(msg("a", 7))
    m = inbox.get(timeout=0.01) if blocking else inbox.get_nowait()
    assert (m.src, m.body["i"]) == ("a", 7)
