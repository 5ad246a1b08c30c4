"""A lost connection is evidence of failure too (issue 9: failover within 1 s): the evidence.

On real sockets through the real Toxiproxy: a peer whose sockets close is reported lost by the
ROUTER's endpoint, and a live peer whose connection a healed blackhole closed is heard again (it
heartbeats at once on reconnect). The rule on a virtual clock: tests/unit/test_failure_detection.py.
"""

from __future__ import annotations

import time
from pathlib import Path

from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events


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
