"""Reliable messages a receiver's fence has moved past: dropped once, not resent for ever.

Real WanNodes on real CURVE sockets (the insider test's cluster: `b` serves `a` and `c`). The
controller-heldout v5 study found the defect this guards: a receiver refused a stale-epoch message
without an ack, so its sender resent it every retransmit timeout for the rest of the run; after a long
bandwidth collapse one site resent 53 MB of superseded parts every 10 s and the current epoch's
messages queued behind them. Now the receiver answers a refused stale message with a notice of its
fence, and the sender drops exactly what that fence refuses: fenced kinds of earlier epochs, to that
receiver only.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ground.config import WanConfig
from ground.eventlog import read_events
from tests.live.test_wan_insider import Cluster, drain, frames, rejected, wait_until


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path, WanConfig(retransmit_timeout_ms=300, max_frame_bytes=1 << 20))
    yield c
    c.close()


def events(log: Path, name: str) -> list[dict]:
    return [e for e in read_events(log) if e["event"] == name]


def test_messages_below_the_receivers_fence_are_dropped_once_and_the_rest_delivered(cluster):
    b_in = cluster.b.inbox("data", "heartbeat")
    cluster.b.set_fence(2)
    cluster.b.start()
    cluster.a.start()
    for i in range(3):  # superseded: epoch 1 < b's fence 2
        cluster.a.send("b", "data", "collective", {"i": i}, epoch=1)
    cluster.a.send("b", "heartbeat", "control", {"i": 10}, epoch=1)  # an unfenced kind: delivered
    cluster.a.send("b", "data", "collective", {"i": 20}, epoch=2)  # the current epoch
    cluster.a.send("b", "data", "collective", {"i": 30}, epoch=3)  # ahead of b's fence: admitted
    got = drain(b_in, 3)
    assert sorted(m.body["i"] for m in got) == [10, 20, 30]
    assert cluster.a.wait_acked(10, "b"), f"a still holds {cluster.a.unacked('b')} messages for b"
    assert cluster.a.superseded == 3
    # The counter is bumped before the log line is written: wait for the line, not only the counter.
    deadline = time.monotonic() + 10
    while True:
        dropped = events(cluster.tmp / "a.jsonl", "superseded_dropped")
        if sum(e["messages"] for e in dropped) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sum(e["messages"] for e in dropped) == 3
    assert all(e["dest"] == "b" and e["fence_epoch"] == 2 and e["peer_inc"] == cluster.b.inc for e in dropped)
    # Nothing is resent after the drop: b's count of stale refusals stops growing. Frames a sent
    # before the drop (a resend of all three, one of which brought the notice back) may still be
    # refused and logged by b after a's line: wait until b's count holds for two retransmit
    # timeouts (it never would if a resent every timeout), then watch five more.
    stale = lambda: [e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "stale_epoch"]  # noqa: E731
    deadline, n, since = time.monotonic() + 10, len(stale()), time.monotonic()
    while time.monotonic() - since < 0.6 and time.monotonic() < deadline:
        time.sleep(0.05)
        if (m := len(stale())) != n:
            n, since = m, time.monotonic()
    assert n >= 3
    time.sleep(1.5)  # five retransmit timeouts
    assert len(stale()) == n, "a kept resending messages b's fence refuses"
    assert b_in.empty()
    # A stale notice is not an ack: nobody learns that b took the dropped messages.
    assert all(cluster.a.acked_by("b", s) is None for s in (1, 2, 3))


def test_a_peer_still_in_an_earlier_epoch_keeps_getting_its_messages(cluster):
    """The reverted fix dropped everything of earlier epochs when the *sender* moved on; a peer still
    finishing the old round starved. Only the receiver's own fence drops anything."""
    b_in = cluster.b.inbox("data")
    cluster.b.set_fence(1)
    cluster.b.start()
    cluster.a.set_fence(5)  # a has moved on; b has not
    cluster.a.start()
    for i in range(5):
        cluster.a.send("b", "data", "collective", {"i": i}, epoch=1)
    assert sorted(m.body["i"] for m in drain(b_in, 5)) == list(range(5))
    assert cluster.a.wait_acked(10, "b")
    assert cluster.a.superseded == 0


def test_an_insider_cannot_make_a_node_drop_messages_for_another_member(cluster):
    """A key holder's stale notice speaks only for its own fence: c's notice leaves b's messages for
    a alone, and a notice claiming to come from a is refused as an identity mismatch."""
    b_in = cluster.b.inbox("hello")
    cluster.b.start()
    cluster.a.start()
    cluster.a.send("b", "hello", "control", {})
    assert drain(b_in, 1), "b never heard from a"  # b now routes to a through a's connection
    cluster.a.close()  # a is gone: b's message to a stays unacked
    seq = cluster.b.send("a", "data", "control", {"i": 1}, epoch=0)
    time.sleep(0.5)
    assert cluster.b.unacked("a") == 1
    s = cluster.insider(b"c#77")
    notice = {"seq": seq, "inc": cluster.b.inc, "stale_fence": 99}
    s.send_multipart(frames(kind="ack", src="c", body=notice))
    s.send_multipart(frames(kind="ack", src="a", body=notice))
    assert wait_until(lambda: any(e["reason"] == "identity_mismatch" for e in rejected(cluster.tmp / "b.jsonl")))
    time.sleep(0.5)
    assert cluster.b.unacked("a") == 1
    assert cluster.b.superseded == 0
    assert not events(cluster.tmp / "b.jsonl", "superseded_dropped")


def test_a_message_of_a_kind_the_receiver_has_no_inbox_for_is_refused_once_not_resent(cluster):
    """The receiver registered no inbox for "data" (inboxes are fixed before a node starts): it
    refuses the message for good instead of leaving it unacked, and the sender forgets it and says
    so (`send_refused`), instead of resending it every retransmit timeout for the rest of the run."""
    b_in = cluster.b.inbox("heartbeat")
    cluster.b.start()
    cluster.a.start()
    cluster.a.send("b", "heartbeat", "control", {"i": 2}, epoch=0)
    assert [m.body["i"] for m in drain(b_in, 1)] == [2]  # b has a route back to a (a refusal needs one)
    cluster.a.send("b", "data", "control", {"i": 1}, epoch=0)
    assert cluster.a.wait_acked(10, "b"), f"a still holds {cluster.a.unacked('b')} messages for b"
    assert cluster.a.refused_by_peer == 1 and cluster.a.retransmits == 0
    assert wait_until(lambda: events(cluster.tmp / "a.jsonl", "send_refused"))
    (e,) = events(cluster.tmp / "a.jsonl", "send_refused")
    assert (e["dest"], e["kind"], e["reason"]) == ("b", "data", "refused by b: unknown_kind")
    time.sleep(3 * 0.3)  # three retransmit timeouts: nothing comes again
    assert [r["reason"] for r in rejected(cluster.tmp / "b.jsonl")] == ["unknown_kind"]
