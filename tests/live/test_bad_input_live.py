"""Bad input against a live cluster: every frame is rejected with a logged reason, the site trains on.

A real `xdc run` (real processes, real Toxiproxy); the test connects its own ZeroMQ sockets
straight to site a's listening port, as an intruder on the network would. The insider holds
the coordinator's key pair (a cluster key whose owner never connects to a site); the outsiders
have no key (a plain ZMTP socket) or a key the cluster does not know. Each outsider's refusal
is told apart by the monitor event libzmq reports for it: a CURVE server meeting a NULL client
fails with a protocol error, an unknown CURVE key with the ZAP handler's status 400
(HANDSHAKE_FAILED_AUTH).
"""

from __future__ import annotations

import errno

import json
import time

import numpy as np
import zmq
import zmq.auth

from tests.conftest import assert_ledger_balanced, events
from wan.frames import encode
from wan.keys import load_keypair, load_public


def _dealer(ctx: zmq.Context, addr: str, *, identity: bytes, keys: tuple[bytes, bytes] | None,
            server_key: bytes | None) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    # A send never waits long: a DEALER whose handshake was refused has no pipe, and a blocking send
    # on it would wait forever (CI once sat here until pytest's timeout).
    s.setsockopt(zmq.SNDTIMEO, 10_000)
    s.setsockopt(zmq.ROUTING_ID, identity)
    if keys is not None:
        s.curve_publickey, s.curve_secretkey = keys
        s.curve_serverkey = server_key
    s.connect(addr)
    return s


def _try_send(s: zmq.Socket, frames: list) -> None:
    """Offer frames to a socket whose handshake the site is expected to refuse: the refusal, not the
    frames, is what the test observes, so a socket already refused (no pipe to queue on) is fine."""
    try:
        s.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.Again:
        pass


def _reasons(run_dir) -> list[dict]:
    return [e for e in events(run_dir, "a") if e["event"] == "frame_rejected"]


def _wait_for(pred, timeout_s: float = 30.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s and not pred():
        time.sleep(0.25)


def test_malformed_oversized_stale_and_unauthenticated_frames_are_rejected_and_site_keeps_training(background_run):
    run = background_run(["train.mode=sync", "train.target_useful_tokens=98304", "train.threads_per_site=1",
                          "train.device=cpu", "wan.max_frame_bytes=2097152", "train.checkpoint_every_rounds=100"])
    run.wait_for_event("a", "round_done", timeout_s=180)
    run_dir = run.run_dir
    topo = json.loads((run_dir / "topology.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    addr = f"tcp://{topo['binds']['a']}"
    keys = run_dir / "keys"
    a_pub = load_public(keys, "a")
    coord = load_keypair(keys, "coord")  # a cluster key whose identity never connects to a site
    run_id = cfg["run_id"]
    ctx = zmq.Context()
    try:
        s = _dealer(ctx, addr, identity=b"coord", keys=(coord.public, coord.secret), server_key=a_pub)

        def msg(**kw):
            base = dict(kind="coll", cls="collective", run=run_id, epoch=1, step=0, src="coord", inc=7, seq=0,
                        body={"round": 0, "phase": "rs", "shard": 0, "offset": 0, "total": 1, "scale": 1.0})
            base.update(kw)
            return encode(**base)

        s.send_multipart(msg(epoch=0))  # stale epoch (the cluster is in epoch 1)
        s.send_multipart(msg(run="someone-elses-run"))  # wrong run id
        s.send_multipart(msg(src="mallory"))  # the coordinator's key claiming another name
        s.send_multipart(msg(kind="no_such_kind"))  # nobody registered this kind
        s.send_multipart([b"\xc1 this is not msgpack"])  # malformed header
        big = np.zeros(1_500_000, dtype=np.uint8)
        s.send_multipart(msg(arrays=[big, big]))  # 3 MB message, limit is 2 MiB
        want = {"stale_epoch", "wrong_run", "identity_mismatch", "unknown_kind", "malformed_header", "too_large"}
        _wait_for(lambda: want <= {e["reason"] for e in _reasons(run_dir)})
        # No CURVE at all: a protocol failure, never an authentication failure.
        before = {e["id"] for e in _reasons(run_dir)}  # failures logged before the plain socket (CI saw one)
        plain = _dealer(ctx, addr, identity=b"plain", keys=None, server_key=None)
        _try_send(plain, [b"hello"])

        # The plain socket's handshake fails one of two ways, by libzmq's timing: the site reads the
        # NULL greeting and logs the mechanism mismatch, or the plain socket reads the site's CURVE
        # greeting first and hangs up, and the site logs the broken connection (code EPIPE, no detail).
        def plain_failures() -> list[dict]:
            return [e for e in _reasons(run_dir) if e["id"] not in before and e["reason"].startswith("handshake_failed")]

        def protocol_failures() -> list[dict]:
            return [e for e in plain_failures() if (e["reason"] == "handshake_failed_protocol"
                                                    and e["code"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                    or (e["reason"] == "handshake_failed_no_detail" and e["code"] == errno.EPIPE)]
        _wait_for(lambda: bool(protocol_failures()))
        assert protocol_failures(), f"the plain socket's failed handshake was not logged: {plain_failures()}"
        mismatch = [e for e in protocol_failures() if e["reason"] == "handshake_failed_protocol"]
        assert all("zmtp_mechanism_mismatch" in e["detail"] for e in mismatch), mismatch
        assert not [e for e in plain_failures() if e["reason"] == "handshake_failed_auth"], plain_failures()
        plain.close(0)
        # CURVE with a key the cluster does not know: the ZAP handler refuses it (status 400).
        stranger_pub, stranger_sec = zmq.curve_keypair()
        stranger = _dealer(ctx, addr, identity=b"stranger", keys=(stranger_pub, stranger_sec), server_key=a_pub)
        _try_send(stranger, msg(src="stranger"))
        _wait_for(lambda: any(e["reason"] == "handshake_failed_auth" for e in _reasons(run_dir)))
    finally:
        ctx.destroy(linger=0)
    rejected = _reasons(run_dir)
    reasons = {e["reason"] for e in rejected}
    assert want <= reasons, reasons
    auth = [e for e in rejected if e["reason"] == "handshake_failed_auth"]
    assert auth and all(e["code"] == 400 for e in auth), auth
    mismatch = next(e for e in rejected if e["reason"] == "identity_mismatch")
    assert "key of 'coord'" in mismatch["detail"] and mismatch["src"] == "mallory"
    stale = next(e for e in rejected if e["reason"] == "stale_epoch")
    assert "message epoch 0 < current epoch 1" in stale["detail"]
    # The site kept training after the attacks and the run ended cleanly.
    attack_ns = min(e["mono_ns"] for e in rejected)
    assert run.wait(300) == 0
    later = [e for e in events(run_dir, "a") if e["event"] == "round_done" and e["mono_ns"] > attack_ns]
    assert later, "site a did not train after the bad frames"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["clean_exit"]
    assert_ledger_balanced(run_dir, summary)
    assert summary["useful_tokens"] >= 98304
