"""The byte checker's bound on heartbeat bytes, against a real proxied connection.

Two real WanNodes (CURVE on) over the real Toxiproxy, idle: whatever crosses is the ZMTP greeting,
the CURVE handshake and ZMTP heartbeats. The rate is the difference of two idle lifetimes (so the
handshake cancels), both directions together as the checker reads a link. It must stay under the
checker's bound, and above half of it, so the bound is neither wrong nor vacuous.
"""

from __future__ import annotations

import time
from dataclasses import replace

from analysis.checkers import HANDSHAKE_BOUND_B, heartbeat_bound_b_per_s
from bench.common import BenchCluster
from ground.config import LinkProfile, LinkSpec, WanConfig

IVL_MS = 250  # a short heartbeat interval: four times the commands of the default, so a short test


def _idle_bytes(idle_s: float) -> tuple[int, float]:
    wan = replace(WanConfig(), zmq_heartbeat_ivl_ms=IVL_MS)
    spec = LinkSpec(LinkProfile(5, 0, 0), LinkProfile(5, 0, 0))
    with BenchCluster(["a", "b"], {"a_to_b": spec}, wan) as cl:
        cl.start()
        t0 = time.monotonic()
        time.sleep(idle_s)
        for node in cl.nodes.values():
            node.close()
        lived = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while not cl.client.proxy_bytes() and time.monotonic() < deadline:
            time.sleep(0.1)  # Toxiproxy adds a connection's bytes once it has closed
        pb = cl.client.proxy_bytes()["a_to_b"]
    return pb["upstream"] + pb["downstream"], lived


def test_idle_heartbeats_stay_under_the_checkers_bound_and_near_it():
    short_b, short_s = _idle_bytes(1.0)
    long_b, long_s = _idle_bytes(5.0)
    rate = (long_b - short_b) / (long_s - short_s)
    bound = heartbeat_bound_b_per_s(IVL_MS)
    assert short_b <= HANDSHAKE_BOUND_B + bound * short_s, (short_b, short_s)
    assert 0.5 * bound <= rate <= bound, (rate, bound, short_b, long_b)
