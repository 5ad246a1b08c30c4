"""A peer stopped by SIGSTOP (a `site_hang`, a store outage in mode stop) keeps its connections when
the stop is shorter than the ZMTP heartbeat timeout, and what was sent meanwhile arrives once.

Why it matters: libzmq 4.3.5 can abort a process resumed after its peers' heartbeats closed its
connections during the stop (upstream issue #4841; the controller-heldout study lost two runs to
it), so `wan.zmq_heartbeat_timeout_ms` is set past the longest stop a scenario gives. The second
test is the control: the same stop against a shorter timeout does close the connection, so the
first test's "no link_down" is the timeout's doing.

Real processes: the peer is a separate OS process (so SIGSTOP stops its I/O thread too), the link
is a real Toxiproxy proxy, the sockets real CurveZMQ.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from ground.config import WanConfig
from ground.eventlog import EventLog, read_events
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port

# The stopped peer: node b, bound on `port`, writing each delivered message's index to `got`.
_PEER = r"""
import json, sys, time
from ground.config import WanConfig
from ground.eventlog import EventLog
from wan.node import WanNode
arg = json.loads(sys.argv[1])
wan = WanConfig(zmq_heartbeat_ivl_ms=arg["ivl"], zmq_heartbeat_timeout_ms=arg["timeout"])
log = EventLog(arg["log"], "r1", "b")
b = WanNode(name="b", run_id="r1", wan=wan, log=log, bind=f"tcp://127.0.0.1:{arg['port']}",
            server_links={"a": "a_to_b"}, members=["a"], keys_dir=arg["keys"])
q = b.inbox("data")
b.start()
with open(arg["got"], "a") as f:
    print("ready", flush=True)
    while True:
        m = q.get(timeout=60)
        f.write(f"{m.body['i']}\n")
        f.flush()
"""

IVL_MS = 200


def _run(tmp: Path, toxiproxy, *, timeout_ms: int, stop_s: float) -> tuple[list[dict], list[int]]:
    """a sends 40 messages to b: 20, then b is stopped for `stop_s` while a sends 20 more, then b
    resumes. Returns a's event log and the indices b delivered."""
    generate_cluster_keys(tmp / "keys", ["a", "b"])
    port = free_port()
    proxy = toxiproxy.create_proxy("a_to_b", "127.0.0.1:0", f"127.0.0.1:{port}")
    got = tmp / "got.txt"
    arg = {"ivl": IVL_MS, "timeout": timeout_ms, "port": port, "keys": str(tmp / "keys"),
           "log": str(tmp / "b.jsonl"), "got": str(got)}
    peer = subprocess.Popen([sys.executable, "-c", _PEER, json.dumps(arg)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    wan = replace(WanConfig(), zmq_heartbeat_ivl_ms=IVL_MS, zmq_heartbeat_timeout_ms=timeout_ms)
    log = EventLog(tmp / "a.jsonl", "r1", "a")
    a = WanNode(name="a", run_id="r1", wan=wan, log=log, routes=[Route("b", "a_to_b", f"tcp://{proxy.listen}")],
                members=["b"], keys_dir=str(tmp / "keys"))
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == "ready", "the peer process did not start"
        a.start()
        for i in range(20):
            a.send("b", "data", "collective", {"i": i})
        _wait(lambda: _lines(got) >= 20, 20, "the first 20 messages before the stop")
        os.kill(peer.pid, signal.SIGSTOP)
        try:
            for i in range(20, 40):
                a.send("b", "data", "collective", {"i": i})
            time.sleep(stop_s)
        finally:
            os.kill(peer.pid, signal.SIGCONT)
        _wait(lambda: _lines(got) >= 40, 30, "all 40 messages after the stop")
        time.sleep(0.5)  # anything delivered twice would show now
        assert peer.poll() is None, f"the peer process died after SIGCONT (exit {peer.returncode})"
    finally:
        a.close()
        peer.kill()
        peer.wait()
        log.close()
    return read_events(tmp / "a.jsonl"), [int(x) for x in got.read_text().split()]


def _lines(p: Path) -> int:
    return len(p.read_text().split()) if p.exists() else 0


def _wait(cond, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_peer_stopped_shorter_than_the_zmtp_timeout_keeps_its_connection(tmp_path: Path, toxiproxy) -> None:
    events, got = _run(tmp_path, toxiproxy, timeout_ms=4000, stop_s=2.0)
    assert got == list(range(40)), "every message once, in order"
    assert [e for e in events if e["event"] == "link_down"] == [], "the stop closed a's connection to b"


def test_peer_stopped_longer_than_the_zmtp_timeout_loses_its_connection(tmp_path: Path, toxiproxy) -> None:
    """The control: a 1 s timeout against the same 2 s stop closes the connection (a logs link_down)
    and the reliable layer still delivers every message once after the reconnect."""
    events, got = _run(tmp_path, toxiproxy, timeout_ms=1000, stop_s=2.0)
    assert sorted(set(got)) == list(range(40)) and len(got) == 40, "every message exactly once"
    downs = [e for e in events if e["event"] == "link_down"]
    assert downs and downs[0]["peer"] == "b", "a 1 s ZMTP timeout did not close the connection to a stopped peer"


def test_close_with_a_wedged_io_thread_says_so_and_leaves_the_context_open(tmp_path: Path) -> None:
    """An I/O thread still busy when `close()` gives up (here: a periodic task that blocks) keeps its
    sockets; terminating the context would block on them, so close() returns False, leaves the
    context open and logs `wan_close_incomplete`. Once the thread is free, close() completes."""
    import threading

    generate_cluster_keys(tmp_path / "keys", ["a", "b"])
    log = EventLog(tmp_path / "b.jsonl", "r1", "b")
    b = WanNode(name="b", run_id="r1", wan=WanConfig(), log=log, bind=f"tcp://127.0.0.1:{free_port()}",
                server_links={"a": "a_to_b"}, members=["a"], keys_dir=str(tmp_path / "keys"))
    entered, release = threading.Event(), threading.Event()

    def wedge() -> None:
        entered.set()
        release.wait(30)

    b.every(10, wedge)
    b.start()
    try:
        assert entered.wait(10), "the periodic task never ran"
        assert b.close(timeout_s=0.3) is False
        assert not b.closed
        got = [e for e in read_events(tmp_path / "b.jsonl") if e["event"] == "wan_close_incomplete"]
        assert len(got) == 1 and got[0]["timeout_s"] == 0.3 and "left open" in got[0]["reason"]
    finally:
        release.set()
    assert b.close(timeout_s=10) is True and b.closed
    log.close()
