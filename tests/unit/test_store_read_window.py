"""The store serves a requester's blob reads only while it holds less than READ_WINDOW_BYTES of
unacked replies for it (issue 54): a site that asks and never acks cannot make the store hold (and
resend) every reply until it runs out of memory. The handler's decision on a real BlobStore, with a
stand-in for the WAN node that reports how much is unacked (pure logic: no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_store.blobstore import BlobStore
from checkpoint_store.service import READ_WINDOW_BYTES, StoreService
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events
from ground.journal import AnnouncedEpochs
from wan.frames import Message


@dataclass
class NodeStandIn:
    """Records what the store sends; `held` is the unacked bytes per destination the test sets."""

    wan: WanConfig = field(default_factory=WanConfig)
    held: dict[str, int] = field(default_factory=dict)
    sent: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    def unacked_bytes(self, dest: str) -> int:
        return self.held.get(dest, 0)

    def send(self, dest: str, kind: str, cls: str, body: dict[str, Any], arrays: Any = (), **_: Any) -> int:
        self.sent.append((dest, kind, body))
        return len(self.sent)


def blob_get(src: str, sha: str, i: int) -> Message:
    return Message(kind="ckpt_blob_get", cls="checkpoint", run="r", epoch=1, step=0, src=src, inc=1, seq=i,
                   body={"req": f"{src}-{i}", "sha256": sha, "offset": 0, "length": 1024})


def test_a_requester_over_its_read_window_is_not_served_until_it_acks_and_others_still_are(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    sha = store.put_blob(b"x" * 4096)
    node = NodeStandIn()
    log = EventLog(tmp_path / "store.jsonl", "r", "store")
    svc = StoreService(node=node, store=store, log=log, run_id="r", epochs=AnnouncedEpochs(tmp_path / "journal.jsonl"))

    node.held["evil"] = READ_WINDOW_BYTES - 100  # the next 1 KiB part would pass the window
    for i in range(1, 2001):
        svc.handle(blob_get("evil", sha, i))
    svc.handle(blob_get("a", sha, 1))
    assert [(d, k) for d, k, _ in node.sent] == [("a", "ckpt_blob_part")]  # evil got nothing, a its part

    node.held["evil"] = 0  # it acked: served again
    svc.handle(blob_get("evil", sha, 2001))
    assert node.sent[-1][:2] == ("evil", "ckpt_blob_part")

    log.close()
    dropped = [e for e in read_events(tmp_path / "store.jsonl") if e["event"] == "ckpt_request_failed"]
    # logged on the first drop and on every 1,000th, not once per request
    assert len(dropped) == 3 and all(e["src"] == "evil" and e["reason"].startswith("read_window:") for e in dropped)
    assert "request 2000 over it dropped unanswered" in dropped[-1]["reason"]
