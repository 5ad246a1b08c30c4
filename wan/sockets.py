"""The ZeroMQ sockets of a WAN node, made and configured: the options every socket gets, the
ROUTER a process serves on, and the DEALER per route (see wan/node.py for why each option is set
and for the identity rules the routing ids serve).
"""

from __future__ import annotations

import secrets
from pathlib import Path

import zmq

from ground.config import WanConfig
from ground.processes import COORD
from wan import keys as keymod
from wan.receiver import ROUTING_ID_SEP

# A DEALER to the coordinator retries a closed connection this often (ZeroMQ's default, kept for
# the other routes, is 100 ms; both plus up to as much random jitter). A live site whose connection
# closed (a healed blackhole) is back and heard well within the coordinator's disconnect grace
# (coordinator/membership.py). Only that route: a retry to a dead peer through its proxy is
# accepted, then closed, and logged; there is no point in doing that faster elsewhere.
RECONNECT_IVL_MS = 40
FAST_RECONNECT_PEERS = frozenset({COORD})


def configure(s: zmq.Socket, wan: WanConfig) -> None:
    """The options every node socket gets."""
    s.setsockopt(zmq.LINGER, wan.linger_ms)
    # ZMTP heartbeats notice a silent blackhole where TCP stays up (values in ms).
    s.setsockopt(zmq.HEARTBEAT_IVL, wan.zmq_heartbeat_ivl_ms)
    # Timeout and TTL well past the longest stop a fault gives a process (ground/config.py).
    s.setsockopt(zmq.HEARTBEAT_TIMEOUT, wan.zmq_heartbeat_timeout_ms)
    s.setsockopt(zmq.HEARTBEAT_TTL, wan.zmq_heartbeat_timeout_ms)
    # Checked per frame before allocation; the header frame limit is separate and smaller.
    s.setsockopt(zmq.MAXMSGSIZE, wan.max_frame_bytes + 1024)
    s.setsockopt(zmq.SNDHWM, 10_000)
    s.setsockopt(zmq.RCVHWM, 10_000)


def router(ctx: zmq.Context, wan: WanConfig, keypair: keymod.Keypair | None) -> zmq.Socket:
    """The server socket (not yet bound): a CURVE server when `keypair` is given (the caller starts the
    ZAP authenticator first)."""
    r = ctx.socket(zmq.ROUTER)
    configure(r, wan)
    r.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises instead of dropping
    r.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a rejoining peer may reuse its identity
    if keypair is not None:
        r.curve_server = True
        r.curve_publickey = keypair.public
        r.curve_secretkey = keypair.secret
    return r


def dealer(ctx: zmq.Context, wan: WanConfig, name: str, peer: str, keypair: keymod.Keypair | None,
           keys_dir: str | Path | None) -> zmq.Socket:
    """The client socket of node `name` for its route to `peer` (not yet connected): a fresh
    unguessable routing id, and with CURVE the peer's public key as the server key it verifies."""
    d = ctx.socket(zmq.DEALER)
    configure(d, wan)
    d.setsockopt(zmq.ROUTING_ID, f"{name}{ROUTING_ID_SEP}{secrets.token_hex(8)}".encode())
    if peer in FAST_RECONNECT_PEERS:
        d.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    if keypair is not None:
        assert keys_dir is not None
        d.curve_publickey = keypair.public
        d.curve_secretkey = keypair.secret
        d.curve_serverkey = keymod.load_public(keys_dir, peer)
    return d
