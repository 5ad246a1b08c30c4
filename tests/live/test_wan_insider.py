"""An insider (a holder of one cluster key) against a live WanNode: real sockets, real CURVE keys.

Server node `b` (a ROUTER, CURVE, the cluster's ZAP handler) hears from members `a` and `c`.
The genuine `a` is a WanNode; the insider is a raw DEALER holding `c`'s key pair, which it
uses to claim `a`'s identity, send kinds nobody registered, flood an inbox, jump the
sequence window and send oversized multipart messages. Each attempt must be refused with a
logged reason while `a` keeps working, and a dead I/O thread must end its process non-zero.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import zmq

from wan.frames import MAX_BUFFERS, decode, encode
from wan.keys import generate_cluster_keys, load_keypair, load_public
from wan.node import WAN_CRASH_EXIT_CODE, Route, WanNode
from wan.toxiproxy import free_port
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events

ROOT = Path(__file__).resolve().parents[2]
RUN = "r1"


class Cluster:
    """b serves; a is a genuine client node; `insider()` opens raw sockets with a cluster key."""

    def __init__(self, tmp: Path, wan: WanConfig) -> None:
        self.tmp, self.wan = tmp, wan
        self.keys = tmp / "keys"
        generate_cluster_keys(self.keys, ["a", "b", "c"])
        self.port = free_port()
        self.addr = f"tcp://127.0.0.1:{self.port}"
        self.logs = {n: EventLog(tmp / f"{n}.jsonl", RUN, n) for n in ("a", "b")}
        self.b = WanNode(name="b", run_id=RUN, wan=wan, log=self.logs["b"], bind=self.addr,
                         server_links={"a": "a_to_b", "c": "c_to_b"}, members=["a", "c"], keys_dir=str(self.keys))
        self.a = WanNode(name="a", run_id=RUN, wan=wan, log=self.logs["a"], routes=[Route("b", "a_to_b", self.addr)],
                         members=["b"], keys_dir=str(self.keys))
        self.ctx = zmq.Context()

    def insider(self, routing_id: bytes, key_owner: str = "c", *, curve_keys: tuple[bytes, bytes] | None = None
                ) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, routing_id)
        if curve_keys is None:
            kp = load_keypair(self.keys, key_owner)
            curve_keys = (kp.public, kp.secret)
        s.curve_publickey, s.curve_secretkey = curve_keys
        s.curve_serverkey = load_public(self.keys, "b")
        s.connect(self.addr)
        return s

    def close(self) -> None:
        self.ctx.destroy(linger=0)
        self.a.close()
        self.b.close()


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path, WanConfig(retransmit_timeout_ms=500, max_frame_bytes=1 << 20))
    yield c
    c.close()


def frames(**kw: Any) -> list[Any]:
    base: dict[str, Any] = dict(kind="data", cls="control", run=RUN, epoch=0, step=0, src="c", inc=99, seq=0,
                                body={"i": -1})
    base.update(kw)
    return encode(**base)


def rejected(log: Path) -> list[dict]:
    return [e for e in read_events(log) if e["event"] == "frame_rejected"]


def wait_until(pred: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def drain(q: Any, n: int, timeout_s: float = 15.0) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        try:
            got.append(q.get(timeout=0.2))
        except Exception:
            continue
    return got


def test_key_holder_claiming_another_members_routing_id_is_refused_and_the_genuine_peer_keeps_working(cluster):
    b_in = cluster.b.inbox("data")
    a_in = cluster.a.inbox("reply")
    cluster.b.start()
    cluster.a.start()
    # The genuine a is connected and known to b before the insider shows up.
    cluster.a.send("b", "data", "control", {"i": 0})
    assert drain(b_in, 1)[0].src == "a"
    # c's key, claiming a's name as routing id (the old scheme's id, and the new scheme's shape).
    thieves = [cluster.insider(b"a"), cluster.insider(b"a#0000000000000000")]
    time.sleep(0.3)
    for t in thieves:
        t.send_multipart(frames(src="a", seq=1, body={"i": 666}))  # a's name in the message too
        t.send_multipart(frames(src="c", seq=1, body={"i": 667}))  # its own name, a's routing id
    # The genuine a keeps working both ways while the thieves stay connected.
    for i in range(1, 51):
        cluster.a.send("b", "data", "control", {"i": i}, [np.full(16, i, dtype=np.float32)])
        cluster.b.send("a", "reply", "control", {"i": i})
    got_b = drain(b_in, 50)
    got_a = drain(a_in, 50)
    assert sorted(m.body["i"] for m in got_b) == list(range(1, 51))
    assert all(m.src == "a" for m in got_b)
    assert sorted(m.body["i"] for m in got_a) == list(range(1, 51))
    assert cluster.a.wait_acked(10) and cluster.b.wait_acked(10)
    # Nothing b sent to a went to a thief.
    for t in thieves:
        assert t.poll(200) == 0, "a message for a reached the insider"
    assert b_in.empty()
    assert wait_until(lambda: sum(e["reason"] == "identity_mismatch" for e in rejected(cluster.tmp / "b.jsonl")) >= 4)
    mismatches = [e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "identity_mismatch"]
    assert all("key of 'c'" in e["detail"] for e in mismatches), mismatches
    assert not [e for e in read_events(cluster.tmp / "a.jsonl") if e["event"] == "link_down"]


def test_insider_with_its_own_identity_sending_an_unregistered_kind_is_rejected_unacked_and_refused(cluster):
    b_in = cluster.b.inbox("data")
    cluster.b.start()
    s = cluster.insider(b"c#1234")
    s.send_multipart(frames(kind="data", seq=2, body={"i": 5}))
    m = drain(b_in, 1)[0]  # accepted first: b now has a route back to c (a refusal needs one)
    s.send_multipart(frames(kind="no_such_kind", seq=1))
    assert (m.src, m.body["i"]) == ("c", 5)
    replies = []
    while s.poll(500):
        replies.append(decode(s.recv_multipart(copy=False), max_frame_bytes=1 << 20, max_header_bytes=1 << 16))
    assert sorted((m.kind, m.body["seq"], m.body.get("refused")) for m in replies) == [
        ("ack", 1, "unknown_kind"), ("ack", 2, None)], "the registered kind acked, the other refused for good"
    assert wait_until(lambda: any(e["reason"] == "unknown_kind" for e in rejected(cluster.tmp / "b.jsonl")))
    e = next(e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "unknown_kind")
    assert e["kind"] == "no_such_kind" and e["src"] == "c"
    assert not hasattr(cluster.b, "default_inbox")


def test_full_inbox_rejects_without_ack_and_every_message_arrives_once_after_the_reader_catches_up(cluster):
    b_in = cluster.b.inbox("data", max_messages=20)  # one source may hold a quarter of it: 5 messages
    cluster.b.start()
    cluster.a.start()
    for i in range(20):
        cluster.a.send("b", "data", "control", {"i": i})
    assert wait_until(lambda: b_in.qsize() == 5)
    assert wait_until(lambda: any(e["reason"] == "inbox_full" for e in rejected(cluster.tmp / "b.jsonl")))
    got = drain(b_in, 20, timeout_s=30)  # reading frees room; the sender's resends fill it again
    assert sorted(m.body["i"] for m in got) == list(range(20))
    assert cluster.a.wait_acked(10)


def test_sequence_number_far_above_the_window_is_rejected(cluster):
    b_in = cluster.b.inbox("data")
    cluster.b.start()
    s = cluster.insider(b"c#1")
    s.send_multipart(frames(seq=10**12))
    s.send_multipart(frames(seq=1, body={"i": 1}))
    assert drain(b_in, 1)[0].body["i"] == 1
    assert wait_until(lambda: any(e["reason"] == "seq_window" for e in rejected(cluster.tmp / "b.jsonl")))


def test_multipart_message_over_the_frame_count_or_byte_limit_is_dropped_while_received(cluster):
    b_in = cluster.b.inbox("data")
    cluster.b.start()
    s = cluster.insider(b"c#2")
    s.send_multipart(frames() + [b"x"] * (MAX_BUFFERS + 50))
    chunk = b"\x00" * (600 * 1024)  # each frame under MAXMSGSIZE, together over max_frame_bytes (1 MiB)
    s.send_multipart(frames() + [chunk] * 4)
    s.send_multipart(frames(seq=1, body={"i": 3}))
    assert drain(b_in, 1)[0].body["i"] == 3
    assert wait_until(lambda: {"too_many_frames", "too_large"} <= {e["reason"] for e in rejected(cluster.tmp / "b.jsonl")})
    too_many = next(e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "too_many_frames")
    assert too_many["frames"] == 1 + MAX_BUFFERS + 50


def test_unknown_key_fails_the_handshake_as_an_authentication_failure(cluster):
    cluster.b.start()
    s = cluster.insider(b"x#1", curve_keys=zmq.curve_keypair())
    s.send_multipart(frames(src="x"))
    assert wait_until(lambda: any(e["reason"] == "handshake_failed_auth" for e in rejected(cluster.tmp / "b.jsonl")))
    auth = [e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "handshake_failed_auth"]
    assert {e["code"] for e in auth} == {400}


def test_exception_while_handling_one_message_is_logged_and_the_loop_goes_on(cluster):
    class Exploding:
        def offer(self, msg: Any) -> bool:
            raise RuntimeError("a bug in a consumer's queue")

    b_in = cluster.b.inbox("data")
    cluster.b._queues["boom"] = Exploding()  # type: ignore[assignment]  # a bug planted on purpose
    cluster.b.start()
    s = cluster.insider(b"c#3")
    s.send_multipart(frames(kind="boom", seq=1))
    s.send_multipart(frames(kind="data", seq=2, body={"i": 9}))
    assert drain(b_in, 1)[0].body["i"] == 9
    assert cluster.b.crashed is None
    err = next(e for e in rejected(cluster.tmp / "b.jsonl") if e["reason"] == "handler_error")
    assert "RuntimeError: a bug in a consumer's queue" in err["detail"]


def test_dead_io_thread_ends_the_process_with_the_crash_exit_code(tmp_path):
    """A bug that kills the I/O thread must not leave a process that can still exit 0."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from wan.node import WanNode
        from ground.config import WanConfig
        from ground.eventlog import EventLog
        node = WanNode(name="b", run_id="r1", wan=WanConfig(curve=False), log=EventLog({str(tmp_path / 'b.jsonl')!r}, "r1", "b"),
                       bind="tcp://127.0.0.1:{free_port()}")
        def bug():
            raise RuntimeError("planted bug")
        node._check_retransmit = bug
        node.start()
        time.sleep(30)
        sys.exit(0)  # never reached: the I/O thread's death ends the process first
    """)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert proc.returncode == WAN_CRASH_EXIT_CODE
    assert time.monotonic() - t0 < 20
    crash = [e for e in read_events(tmp_path / "b.jsonl") if e["event"] == "wan_thread_crashed"]
    assert len(crash) == 1 and "planted bug" in crash[0]["error"] and crash[0]["exit_code"] == WAN_CRASH_EXIT_CODE
