"""A site trusts no body, in a live run: well-framed messages with bad bodies never crash it.

A real `xdc run` (real processes, real Toxiproxy). The test holds the coordinator's key pair (an
insider) and connects straight to site a's port; it sends membership messages whose epoch is
"zz", whose members are not a list of names or which lack a field, a shutdown whose reason is a
map, and collective parts with an infinite scale, NaN values, a round of the wrong type or
the wrong payload dtype. Site a rejects each with a logged `message_rejected` and its reason,
keeps training, and the run ends cleanly at its target.
"""

from __future__ import annotations

import json
import time

import numpy as np
import zmq

from tests.conftest import events
from wan.frames import encode
from wan.keys import load_keypair, load_public

PLAN = {"epoch": 1, "members": ["a", "b", "c"], "paused": False, "start_round": 0, "start_cursor": 0,
        "restore": "none"}
PART = {"round": 1, "phase": "rs", "shard": 0, "offset": 0, "total": 1, "scale": 1.0}


def _rejected(run_dir) -> list[dict]:
    return [e for e in events(run_dir, "a") if e["event"] == "message_rejected"]


def test_bad_membership_shutdown_and_collective_bodies_are_rejected_and_the_site_trains_on(background_run):
    run = background_run(["train.mode=sync", "train.target_useful_tokens=49152", "train.threads_per_site=1",
                          "train.device=cpu", "train.checkpoint_every_rounds=100"])
    run.wait_for_event("a", "round_done", timeout_s=180)
    run_dir = run.run_dir
    topo = json.loads((run_dir / "topology.json").read_text())
    run_id = json.loads((run_dir / "config.json").read_text())["run_id"]
    coord = load_keypair(run_dir / "keys", "coord")
    ctx = zmq.Context()
    bad: list[tuple[str, str, dict, list[np.ndarray]]] = [
        ("membership", "control", {**PLAN, "epoch": "zz"}, []),
        ("membership", "control", {**PLAN, "members": "abc"}, []),
        ("membership", "control", {**PLAN, "members": [["a"], {"b": 1}]}, []),
        ("membership", "control", {k: v for k, v in PLAN.items() if k != "start_round"}, []),
        ("membership", "control", {**PLAN, "start_cursor": float("inf")}, []),
        ("shutdown", "control", {"reason": {"nested": True}}, []),
        ("coll", "collective", {**PART, "scale": float("inf")}, [np.ones(1, dtype=np.float32)]),
        ("coll", "collective", {**PART, "round": "x"}, [np.ones(1, dtype=np.float32)]),
        ("coll", "collective", {**PART, "round": float("inf")}, [np.ones(1, dtype=np.float32)]),
        ("coll", "collective", PART, [np.full(1, np.nan, dtype=np.float32)]),
        ("coll", "collective", PART, [np.ones(1, dtype=np.float64).view(np.int64)]),
    ]
    try:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDTIMEO, 10_000)  # a refused handshake leaves no pipe; fail, never hang
        s.setsockopt(zmq.ROUTING_ID, b"coord")
        s.curve_publickey, s.curve_secretkey = coord.public, coord.secret
        s.curve_serverkey = load_public(run_dir / "keys", "a")
        s.connect(f"tcp://{topo['binds']['a']}")
        for kind, cls, body, arrays in bad:
            s.send_multipart(encode(kind=kind, cls=cls, run=run_id, epoch=1, step=0, src="coord", inc=7, seq=0,
                                    body=body, arrays=arrays))
        t0 = time.monotonic()
        while len(_rejected(run_dir)) < len(bad) and time.monotonic() - t0 < 60 and run.proc.poll() is None:
            time.sleep(0.25)
    finally:
        ctx.destroy(linger=0)
    rejected = _rejected(run_dir)
    got = sorted((e["kind"], e["reason"]) for e in rejected)
    assert got == sorted([("membership", "bad_field")] * 4 + [("membership", "missing_field"),
                                                             ("shutdown", "bad_field"),
                                                             ("coll", "non_finite"), ("coll", "non_finite"),
                                                             ("coll", "bad_field"), ("coll", "bad_field"),
                                                             ("coll", "bad_payload")]), got
    details = [e["detail"] for e in rejected]
    assert "membership field 'epoch' must be an integer, got str 'zz'" in details
    assert "membership body lacks field 'start_round'" in details
    assert "collective part field 'scale' = inf is not a finite number" in details
    assert "collective part field 'round' must be an integer, got float inf" in details
    # The site kept training after the bad bodies, and the run ended cleanly at its target.
    first = min(e["mono_ns"] for e in rejected)
    assert run.wait(300) == 0
    later = [e for e in events(run_dir, "a") if e["event"] == "round_done" and e["mono_ns"] > first]
    assert later, "site a did not train after the bad bodies"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["clean_exit"] and summary["work_balanced"]
    assert summary["useful_tokens"] >= 49152
