"""Site c as an insider, for tests/live/test_insider_live.py: `python -m tests.insider_site --run-dir R --site c`.

The real site agent: it joins, trains, reports and checkpoints as any member does, with its own
cluster key. Beside it, one thread attacks the coordinator and the store through c's own WAN node,
so every attack byte crosses c's own Toxiproxy links and is counted in c's traffic classes. Once the
store holds a frontier, in order:
  telemetry flood       TELEMETRY_FLOOD telemetry messages to the coordinator, as fast as they queue
  eviction              a `peer_unreachable` claim against each other member, while c keeps training
  forged frontier       `checkpoint_durable` naming a fabricated manifest for the next round
  forged manifest       a manifest that lists the frontier's largest blob under 64 names
  duplicated blobs      a manifest that lists it under 900 names
  upload exhaustion     UPLOADS one-chunk uploads, none finished
  read amplification    READS reads of the largest blob, chunk by chunk
What was sent is written to R/insider.json (the test compares it with what each target logged).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import site_agent.agent as agent
from ground.topology import COORD, STORE
from wan.frames import encode

TELEMETRY_FLOOD = 3_000
UPLOADS = 40
READS = 150
FORGED_HASH = "f0" * 32  # no manifest has it


def _send_unchecked(node: Any, dest: str, kind: str, cls: str, body: dict[str, Any]) -> None:
    """One message in frames of the insider's own making, past the checks an honest `WanNode.send`
    makes (it refuses a message no receiver would accept): queued once on c's node as an unreliable
    message is, so the bytes cross c's own link and the receiver's limits are what is tested."""
    frames = encode(kind=kind, cls=cls, run=node.run_id, epoch=node.epoch, step=node.step, src=node.name,
                    inc=node.inc, seq=0, body=body)
    with node._lock:
        node._outbox.append((dest, frames, cls, False, 0, None))
    node._wake()


def _attack(site: Any, run_dir: Path) -> None:
    node, others = site.node, [s for s in site.cfg.cluster.sites if s != site.me]
    frontier = run_dir / "store" / "FRONTIER"
    while not frontier.exists() or site.epoch < 1 or site.status.get("round", -1) < 2:
        time.sleep(0.05)
    honest = json.loads((run_dir / "store" / "manifests" / f"{frontier.read_text().strip()}.json").read_text())
    big = max(set(honest["blobs"].values()), key=lambda sha: (run_dir / "store" / "blobs" / sha).stat().st_size)
    size = (run_dir / "store" / "blobs" / big).stat().st_size
    sent: dict[str, Any] = {"started_wall_ns": time.time_ns(), "honest_frontier": frontier.read_text().strip()}

    for i in range(TELEMETRY_FLOOD):
        node.send(COORD, "telemetry", "telemetry", {"flood": i, "round": 0})
    sent["telemetry"] = TELEMETRY_FLOOD
    for peer in others:
        node.send(COORD, "peer_unreachable", "control", {"peer": peer, "detail": f"insider: nothing from {peer}"})
    sent["claims"] = others
    rnd = int(site.status.get("round", 0)) + 1
    node.send(COORD, "checkpoint_durable", "control", {"manifest_hash": FORGED_HASH, "round": rnd, "cursor": 10**6})
    sent["forged_durable"] = {"manifest_hash": FORGED_HASH, "round": rnd}
    forged = dict(honest, ckpt_id="insider", round=int(honest["round"]) + 1, blobs={f"n{i}": big for i in range(64)})
    node.send(STORE, "ckpt_manifest", "checkpoint", {"req": "insider-m64", "manifest": forged})
    _send_unchecked(node, STORE, "ckpt_manifest", "checkpoint",
                    {"req": "insider-m900", "manifest": dict(forged, blobs={f"n{i}": big for i in range(900)})})
    sent["manifests"] = ["insider-m64", "insider-m900"]
    one = np.frombuffer(b"\x00" * 1024, dtype=np.uint8)
    for i in range(UPLOADS):
        node.send(STORE, "ckpt_chunk", "checkpoint", {"req": f"insider-u{i}", "upload": f"insider-u{i}", "offset": 0,
                                                      "sha256": "ab" * 32}, [one])
    sent["uploads"] = UPLOADS
    chunk = site.cfg.wan.chunk_bytes
    for i in range(READS):
        node.send(STORE, "ckpt_blob_get", "checkpoint",
                  {"req": f"insider-r{i}", "sha256": big, "offset": (i * chunk) % max(1, size - chunk), "length": chunk})
    sent.update(reads=READS, read_bytes=READS * chunk, blob=big, blob_bytes=size,
                finished_wall_ns=time.time_ns())
    tmp = run_dir / "insider.json.tmp"
    tmp.write_text(json.dumps(sent))
    os.replace(tmp, run_dir / "insider.json")


def launch_with_insider(cfg: Any) -> tuple[Path, dict[str, Any]]:
    """`cluster.launcher.launch(cfg)` with site c started as this module (every other process as usual):
    (run directory, summary). For the live insider test and bench/insider_flood.py."""
    from cluster import launcher

    real = launcher.Launcher._spawn

    def spawn(self: Any, name: str, module: str, *extra: str) -> None:
        real(self, name, __name__ if (name, module) == ("c", "site_agent.agent") else module, *extra)

    launcher.Launcher._spawn = spawn  # type: ignore[method-assign]
    try:
        run_dir, summary = launcher.launch(cfg, quiet=True, timeout_s=600)
    finally:
        launcher.Launcher._spawn = real  # type: ignore[method-assign]
    return Path(run_dir), summary


def main() -> int:
    run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
    real_init = agent.Site.__init__

    def init(self: Any, *a: Any, **kw: Any) -> None:
        real_init(self, *a, **kw)
        threading.Thread(target=_attack, args=(self, run_dir), name="insider", daemon=True).start()

    agent.Site.__init__ = init  # type: ignore[method-assign]
    return agent.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
