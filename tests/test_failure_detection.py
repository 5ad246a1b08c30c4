"""A lost connection is evidence of failure too (issue 9: failover within 1 s).

The rule (coordinator/membership.py) on a virtual clock first: a member whose connection to the
coordinator closed and who sent nothing since is failed after `disconnect_grace_ms`; one heard
again within the grace is not. Then the evidence itself on real sockets through the real
Toxiproxy: a peer whose sockets close is reported lost by the ROUTER's endpoint, and a live peer
whose connection a healed blackhole closed is heard again (it heartbeats at once on reconnect).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from coordinator import membership
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events

MS = 1_000_000
CFG = membership.MembershipConfig(expected_sites=("a", "b", "c"), heartbeat_timeout_ms=2000, disconnect_grace_ms=300)


def cluster(t_ns: int = 0) -> membership.Membership:
    sites = {s: membership.SiteRecord(s, membership.SiteState.ACTIVE, t_ns, 1) for s in ("a", "b", "c")}
    return membership.Membership(epoch=1, members=("a", "b", "c"), sites=sites)


def test_a_closed_connection_and_silence_for_the_grace_fails_the_member() -> None:
    m = membership.on_connections(cluster(0), {"b": 100 * MS})  # b's connection closed at 100 ms
    assert membership.decide(399 * MS, m, CFG)[0].action == membership.Action.NONE  # 299 ms: within the grace
    d, why = membership.decide(401 * MS, m, CFG)
    assert d == membership.Decision(membership.Action.CONNECTION_LOST, site="b") and "grace 300 ms" in why
    assert membership.apply(m, d).sites["b"].state == membership.SiteState.FAILED
    assert membership.apply(m, d).sites["a"].state == membership.SiteState.ACTIVE


def test_a_member_heard_again_within_the_grace_is_not_failed() -> None:
    m = membership.on_connections(cluster(0), {"b": 100 * MS})
    m = membership.on_heartbeat(membership.on_connections(m, {}), "b", 250 * MS)  # reconnected and heartbeated
    assert m.sites["b"].disconnected_ns == 0
    for t in (401, 1000, 1999):  # (a and c go silent at 2000 ms: the heartbeat rule, not this one)
        assert membership.decide(t * MS, m, CFG)[0].action == membership.Action.NONE, t


def test_silence_alone_still_needs_the_heartbeat_timeout() -> None:
    m = cluster(0)  # a hung process keeps its connection: only the heartbeat timeout sees it
    assert membership.decide(1999 * MS, m, CFG)[0].action == membership.Action.NONE
    assert membership.decide(2001 * MS, m, CFG)[0] == membership.Decision(membership.Action.SUSPECT, site="a")


def test_a_suspect_whose_connection_closes_is_failed_after_the_grace() -> None:
    m = membership.apply(cluster(0), membership.Decision(membership.Action.SUSPECT, site="a"))
    m = membership.on_connections(m, {"a": 2500 * MS})
    assert membership.decide(2801 * MS, m, CFG)[0] == membership.Decision(membership.Action.CONNECTION_LOST, site="a")
    assert membership.apply(m, membership.Decision(membership.Action.CONNECTION_LOST, site="a")).sites["a"].state == membership.SiteState.FAILED


def test_the_rule_is_off_at_grace_zero_and_ignores_done_sites_and_non_members() -> None:
    lost = membership.on_connections(cluster(10**12), {"b": 100 * MS})
    off = membership.MembershipConfig(**{**CFG.__dict__, "disconnect_grace_ms": 0})
    assert membership.decide(10**12, lost, off)[0].action == membership.Action.NONE
    done = membership.on_done(lost, "b")  # finished its work and exited: its connection closes, as it should
    assert membership.decide(10**12, done, CFG)[0].action == membership.Action.NONE
    out = membership.Membership(epoch=2, members=("a", "c"), sites=lost.sites)  # b is not a member any more
    assert membership.decide(10**12, out, CFG)[0].action == membership.Action.NONE


def test_connection_evidence_replaces_the_previous_one() -> None:
    m = membership.on_connections(cluster(0), {"a": 5, "c": 7})
    assert (m.sites["a"].disconnected_ns, m.sites["b"].disconnected_ns, m.sites["c"].disconnected_ns) == (5, 0, 7)
    m2 = membership.on_connections(m, {"c": 9})
    assert (m2.sites["a"].disconnected_ns, m2.sites["c"].disconnected_ns) == (0, 9)
    assert membership.on_connections(m2, {"c": 9}) is m2  # nothing changed: the same state


# ----------------------------------------------------------------------------- live


def _coord_and_site(tmp: Path, toxi):
    """'coord' (ROUTER) and site 'a' (DEALER) reaching it only via proxy a_to_coord; a heartbeats."""
    generate_cluster_keys(tmp / "keys", ["a", "coord"])
    port = free_port()
    proxy = toxi.create_proxy("a_to_coord", "127.0.0.1:0", f"127.0.0.1:{port}")
    wan = WanConfig(heartbeat_interval_ms=200)
    coord = WanNode(name="coord", run_id="r", wan=wan, log=EventLog(tmp / "coord.jsonl", "r", "coord"),
                    bind=f"tcp://127.0.0.1:{port}", server_links={"a": "a_to_coord"}, members=["a"],
                    keys_dir=str(tmp / "keys"))
    a = WanNode(name="a", run_id="r", wan=wan, log=EventLog(tmp / "a.jsonl", "r", "a"),
                routes=[Route("coord", "a_to_coord", f"tcp://{proxy.listen}")], members=["coord"],
                keys_dir=str(tmp / "keys"))
    hb = coord.inbox("heartbeat")
    a.every(wan.heartbeat_interval_ms, lambda: a.send("coord", "heartbeat", "control", {}, reliable=False))
    coord.start()
    a.start()
    hb.get(timeout=10)  # connected and heard
    return coord, a, hb


def _wait(cond, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.005)
    raise AssertionError(f"not within {timeout_s} s")


def test_a_peer_whose_sockets_close_is_reported_lost_until_it_is_heard_again(tmp_path, toxiproxy) -> None:
    coord, a, _hb = _coord_and_site(tmp_path, toxiproxy)
    try:
        assert coord.lost_connections() == {}
        a.close()  # its sockets close, as a killed process's do: the proxy closes coord's side
        _wait(lambda: "a" in coord.lost_connections(), 5)
        (ev,) = [e for e in read_events(tmp_path / "coord.jsonl") if e["event"] == "peer_disconnected"]
        assert ev["peer"] == "a" and ev["link"] == "a_to_coord"
        assert coord.lost_connections()["a"] <= time.monotonic_ns()
    finally:
        coord.close()


def test_a_healed_blackhole_closes_the_connection_and_the_live_peer_is_heard_again(tmp_path, toxiproxy) -> None:
    coord, a, hb = _coord_and_site(tmp_path, toxiproxy)
    try:
        toxiproxy.add_toxic("a_to_coord", "bh", "timeout", "upstream", {"timeout": 0})
        time.sleep(0.6)
        toxiproxy.remove_toxic("a_to_coord", "bh")  # heal: Toxiproxy closes the held connection
        _wait(lambda: "a" in coord.lost_connections(), 5)
        _wait(lambda: "a" not in coord.lost_connections(), 5)  # reconnected and sent something
        while not hb.empty():
            hb.get_nowait()
        hb.get(timeout=1)  # and heartbeats go on
        a_events = [e["event"] for e in read_events(tmp_path / "a.jsonl")]
        assert "link_down" in a_events and "link_up" in a_events
    finally:
        a.close()
        coord.close()


def test_the_load_benchmark_counts_any_decision_about_a_live_site_as_a_false_suspicion() -> None:
    from bench.heartbeat_under_load import detector_suspicions

    healthy = [(t * MS, (t - t % 200) * MS, 0) for t in range(0, 5000, 10)]  # a heartbeat every 200 ms
    assert detector_suspicions(healthy, CFG) == []
    blip = [(t * MS, 0, 100 * MS if t < 250 else 0) for t in range(100, 400, 10)]  # heard again at 250 ms
    assert detector_suspicions(blip, CFG) == []
    lost = [(t * MS, 0, 100 * MS) for t in range(100, 500, 10)]  # still unheard 400 ms after the close
    reasons = detector_suspicions(lost, CFG)
    assert len(reasons) == 9 and all("connection closed" in r for r in reasons)  # 410..490 ms
