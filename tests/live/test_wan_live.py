"""The WAN layer on real sockets through the real Toxiproxy: delivery, reconnects, rejoin, compression."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from site_agent.collective import AllReduce, reduce_in_order
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events


def _pair(tmp: Path, toxi, wan: WanConfig, run_id: str = "r1"):
    """Server node 'b' bound on its own port, client node 'a' reaching it only via proxy a_to_b."""
    generate_cluster_keys(tmp / "keys", ["a", "b"])
    port = free_port()
    proxy = toxi.create_proxy("a_to_b", "127.0.0.1:0", f"127.0.0.1:{port}")
    logs = {n: EventLog(tmp / f"{n}.jsonl", run_id, n) for n in ("a", "b")}
    b = WanNode(name="b", run_id=run_id, wan=wan, log=logs["b"], bind=f"tcp://127.0.0.1:{port}",
                server_links={"a": "a_to_b"}, members=["a"], keys_dir=str(tmp / "keys"))
    a = WanNode(name="a", run_id=run_id, wan=wan, log=logs["a"], routes=[Route("b", "a_to_b", f"tcp://{proxy.listen}")],
                members=["b"], keys_dir=str(tmp / "keys"))
    return a, b, proxy, logs


def test_link_reset_mid_stream_delivers_every_message_exactly_once(tmp_path, toxiproxy):
    wan = WanConfig(retransmit_timeout_ms=2000, zmq_heartbeat_ivl_ms=200)
    a, b, _proxy, logs = _pair(tmp_path, toxiproxy, wan)
    q = b.inbox("data")
    b.start()
    a.start()
    try:
        got: list[int] = []
        for i in range(200):
            a.send("b", "data", "collective", {"i": i}, [np.full(4096, i, dtype=np.float32)])
            if i == 100:
                toxiproxy.set_enabled("a_to_b", False)  # a crash-like cut: the proxy closes the connection
                time.sleep(0.5)
                toxiproxy.set_enabled("a_to_b", True)
        deadline = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < deadline:
            try:
                m = q.get(timeout=0.5)
            except Exception:
                continue
            assert float(m.array(0)[0]) == m.body["i"]
            got.append(m.body["i"])
        assert sorted(got) == list(range(200)), f"missing {sorted(set(range(200)) - set(got))}"
        assert len(got) == len(set(got)), "a message was delivered twice"
        assert a.wait_acked(10)
    finally:
        a.close()
        b.close()
    events = read_events(tmp_path / "a.jsonl")
    assert any(e["event"] == "link_down" for e in events)
    # What was handed to the cut connection and not acked is resent; what came while the link was
    # down waited unhanded and went out after the handshake (`parked_sent`).
    assert any(e["event"] in ("retransmit", "parked_sent") for e in events), "the cut did not force a resend"


def test_a_message_the_receiver_dropped_is_resent_while_newer_ones_keep_being_acked(tmp_path, toxiproxy):
    """b's full inbox drops a message unacked (a genuine sender resends it later), while a keeps
    sending other messages that b acks. The resend used to wait for a destination with no ack
    progress at all, so the steady acks kept the dropped message from ever being resent (equal-work
    v2: a store client's probes and their acks starved a lost request for 64 s)."""
    wan = WanConfig(retransmit_timeout_ms=1500)
    a, b, _proxy, logs = _pair(tmp_path, toxiproxy, wan)
    data = b.inbox("data", max_messages=1)
    pings = b.inbox("ping")
    b.start()
    a.start()
    try:
        a.send("b", "data", "control", {"i": 0})
        a.send("b", "data", "control", {"i": 1})  # finds the inbox full: rejected, not acked
        time.sleep(0.5)
        got = [data.get(timeout=5).body["i"]]
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            a.send("b", "ping", "control", {})  # acked at once: the destination never goes quiet
            while not pings.empty():
                pings.get_nowait()
            try:
                got.append(data.get(timeout=0.3).body["i"])
            except Exception:
                pass
        assert got == [0, 1]
        assert a.wait_acked(10)
    finally:
        a.close()
        b.close()
    rejected = [e for e in read_events(tmp_path / "b.jsonl") if e["event"] == "frame_rejected"]
    assert [e["reason"] for e in rejected] == ["inbox_full"]
    resent = [e for e in read_events(tmp_path / "a.jsonl") if e["event"] == "retransmit"]
    assert resent and "sent after it was acked" in resent[0]["reason"], resent


def test_restarted_peer_reusing_its_identity_is_accepted(tmp_path, toxiproxy):
    wan = WanConfig()
    a, b, proxy, logs = _pair(tmp_path, toxiproxy, wan)
    q = b.inbox("hello")
    b.start()
    a.start()
    try:
        a.send("b", "hello", "control", {"n": 1})
        first = q.get(timeout=10)
        a.close()
        # The same site restarts: same name and routing id, new incarnation.
        a2 = WanNode(name="a", run_id="r1", wan=wan, log=logs["a"],
                     routes=[Route("b", "a_to_b", f"tcp://{proxy.listen}")], members=["b"],
                     keys_dir=str(tmp_path / "keys"))
        a2.start()
        try:
            a2.send("b", "hello", "control", {"n": 2})  # seq 1 again, but a new incarnation: not a duplicate
            second = q.get(timeout=10)
            assert (first.body["n"], second.body["n"]) == (1, 2)
            assert first.inc != second.inc and first.seq == second.seq == 1
            assert a2.wait_acked(5)
        finally:
            a2.close()
    finally:
        b.close()


@pytest.mark.parametrize("compression,ratio", [("none", 1.0), ("fp16", 0.5), ("int8", 0.25)])
def test_three_site_allreduce_over_toxiproxy_agrees_on_every_site(tmp_path, toxiproxy, compression, ratio):
    sites = ["a", "b", "c"]
    generate_cluster_keys(tmp_path / "keys", sites)
    ports = {s: free_port() for s in sites}
    wan = WanConfig(chunk_bytes=64 * 1024)
    nodes, reducers = {}, {}
    for s in sites:
        routes = []
        for t in sites:
            if t != s:
                p = toxiproxy.create_proxy(f"{s}_to_{t}", "127.0.0.1:0", f"127.0.0.1:{ports[t]}")
                routes.append(Route(t, f"{s}_to_{t}", f"tcp://{p.listen}"))
        log = EventLog(tmp_path / f"{s}.jsonl", "r1", s)
        nodes[s] = WanNode(name=s, run_id="r1", wan=wan, log=log, routes=routes, bind=f"tcp://127.0.0.1:{ports[s]}",
                           server_links={t: f"{t}_to_{s}" for t in sites if t != s},
                           members=[t for t in sites if t != s], keys_dir=str(tmp_path / "keys"))
        q = nodes[s].inbox("coll")
        reducers[s] = AllReduce(nodes[s], q, s, wan.chunk_bytes, compression)
    for n in nodes.values():
        n.start()
    rng = np.random.default_rng(0)
    vecs = {s: rng.standard_normal(100_003).astype(np.float32) for s in sites}  # not divisible by 3 on purpose
    out, stats = {}, {}

    def run(s: str) -> None:
        out[s], stats[s] = reducers[s].allreduce_mean(vecs[s], 0, sites, timeout_s=60)

    try:
        threads = [threading.Thread(target=run, args=(s,)) for s in sites]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert set(out) == set(sites)
        # Every site ends with the same bits.
        assert all(np.array_equal(out["a"], out[s]) for s in sites)
        exact = reduce_in_order([vecs[s] for s in sites])
        if compression == "none":
            assert np.array_equal(out["a"], exact)
        else:
            assert np.max(np.abs(out["a"] - exact)) < (1e-2 if compression == "fp16" else 0.05)
        # Bandwidth: each site sends 2(n-1)/n of the vector, in the compressed width.
        expected = 2 * (len(sites) - 1) / len(sites) * vecs["a"].nbytes * ratio
        for s in sites:
            assert abs(stats[s].payload_bytes_sent - expected) / expected < 0.01, (s, stats[s].payload_bytes_sent)
    finally:
        for n in nodes.values():
            n.close()


def test_a_node_whose_port_is_taken_fails_to_start_and_closes_at_once(tmp_path):
    """A failed bind is reported by start(), and close() does not wait on the sockets opened before it."""
    import socket

    import zmq

    generate_cluster_keys(tmp_path / "keys", ["a", "b"])
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        log = EventLog(tmp_path / "b.jsonl", "r1", "b")
        b = WanNode(name="b", run_id="r1", wan=WanConfig(), log=log, bind=f"tcp://127.0.0.1:{port}",
                    routes=[Route("a", "b_to_a", f"tcp://127.0.0.1:{free_port()}")],
                    server_links={"a": "a_to_b"}, members=["a"], keys_dir=str(tmp_path / "keys"))
        with pytest.raises(zmq.ZMQError, match="Address already in use"):
            b.start()
        t0 = time.monotonic()
        b.close()
        assert time.monotonic() - t0 < 5.0, "close() waited on sockets of the failed start"
        log.close()


def test_a_destination_that_never_acks_is_refused_new_messages_past_its_cap(tmp_path):
    """Past `wan.max_unacked_messages` held for one destination, a reliable send is refused (seq 0),
    logged once per 1,000, and nothing more is queued for it (issue 54: a member that asks and never
    acks). Real sockets: the peer's address is never served, so nothing is ever acked."""
    generate_cluster_keys(tmp_path / "keys", ["a", "b"])
    log = EventLog(tmp_path / "a.jsonl", "r1", "a")
    wan = WanConfig(max_unacked_messages=5)
    a = WanNode(name="a", run_id="r1", wan=wan, log=log, routes=[Route("b", "a_to_b", f"tcp://127.0.0.1:{free_port()}")],
                members=["b"], keys_dir=str(tmp_path / "keys"))
    a.start()
    try:
        seqs = [a.send("b", "probe", "control", {"i": i}) for i in range(5)]
        deadline = time.monotonic() + 10
        while a.unacked("b") and a.queued("b") and time.monotonic() < deadline:
            time.sleep(0.01)  # the I/O thread takes them off the outbox (parked: the route never came up)
        assert seqs == [1, 2, 3, 4, 5] and a.unacked("b") == 5
        refused = [a.send("b", "probe", "control", {"i": i}) for i in range(5, 1005)]
        assert refused == [0] * 1000 and a.unacked("b") == 5 and a.refused_over_cap == 1000
        assert a.send("b", "probe", "control", {"i": 0}, reliable=False) == 0  # unreliable: not capped
    finally:
        a.close()
        log.close()
    lines = [e for e in read_events(tmp_path / "a.jsonl") if e["event"] == "send_refused"]
    assert [e["reason"] for e in lines] == ["b holds 5 unacked messages (at most 5): not served until it acks (1 refused so far)",
                                            "b holds 5 unacked messages (at most 5): not served until it acks (1000 refused so far)"]


def test_a_message_no_receiver_would_accept_is_refused_at_the_sender_and_takes_no_sequence_number(tmp_path):
    """A message over the receivers' size limits (its header over `wan.max_header_bytes`, or the whole
    over `wan.max_frame_bytes`) would be refused unread at every receiver and never acked, so resent
    for ever: `send` refuses it (seq 0, `send_refused` with the receiver's reason), queues nothing, and
    the next message takes the sequence number it would have had. Real sockets and a real peer."""
    generate_cluster_keys(tmp_path / "keys", ["a", "b"])
    port = free_port()
    wan = WanConfig(max_header_bytes=4096, max_frame_bytes=1_048_576)
    la, lb = EventLog(tmp_path / "a.jsonl", "r1", "a"), EventLog(tmp_path / "b.jsonl", "r1", "b")
    a = WanNode(name="a", run_id="r1", wan=wan, log=la, routes=[Route("b", "a_to_b", f"tcp://127.0.0.1:{port}")],
                members=["b"], keys_dir=str(tmp_path / "keys"))
    b = WanNode(name="b", run_id="r1", wan=wan, log=lb, bind=f"tcp://127.0.0.1:{port}", members=["a"],
                keys_dir=str(tmp_path / "keys"))
    inbox = b.inbox("probe")
    b.start()
    a.start()
    try:
        assert a.send("b", "probe", "control", {"names": ["x" * 16] * 400}) == 0  # a 7 KB header
        assert a.send("b", "probe", "control", {}, [np.zeros(2_000_000, dtype=np.uint8)]) == 0  # 2 MB in all
        assert a.unacked("b") == 0 and a.queued("b") == 0 and a.refused_undeliverable == 2
        assert a.send("b", "probe", "control", {"i": 1}) == 1  # the refused took no number
        assert a.wait_acked(10.0, "b"), "the deliverable message was not acked"
        got = inbox.get(timeout=5)
        assert got.seq == 1 and got.body == {"i": 1}
    finally:
        a.close()
        b.close()
        la.close()
        lb.close()
    reasons = [e["reason"] for e in read_events(tmp_path / "a.jsonl") if e["event"] == "send_refused"]
    assert len(reasons) == 2 and reasons[0].startswith("undeliverable: header_too_large: header is ")
    assert reasons[1].startswith("undeliverable: too_large: message is 2000") and reasons[1].endswith("limit 1048576")
    assert not [e for e in read_events(tmp_path / "b.jsonl") if e["event"] == "frame_rejected"]

