"""The checkpoint store client takes replies from the store only, and allocates no more than a bounded
blob size on a reply's word (issue 54: any member could answer a request id it learned, and a reply's
`total` was allocated as given). Pure logic of checkpoint_store/client.py, with a stand-in WAN node."""

from __future__ import annotations

import queue
import time
from types import SimpleNamespace

import numpy as np
import pytest

from checkpoint_store.client import StoreClient, StoreError
from ground.eventlog import EventLog, read_events
from wan.frames import Message


class Node:
    """What the client uses of a WAN node: a name, the frame limits, send (records), no restarts seen."""

    def __init__(self) -> None:
        self.name = "a"
        self.wan = SimpleNamespace(max_frame_bytes=1 << 20, max_header_bytes=1 << 12)
        self.sent: list[tuple[str, str, dict]] = []

    def send(self, dest, kind, cls, body, arrays=(), reliable=True) -> int:
        self.sent.append((dest, kind, body))
        return len(self.sent)

    def peer_incarnation(self, dest):
        return None

    def acked_by(self, dest, seq):
        return None


def reply(src: str, kind: str, body: dict, arrays: tuple[np.ndarray, ...] = ()) -> Message:
    return Message(kind=kind, cls="checkpoint", run="r", epoch=0, step=0, src=src, inc=1, seq=1, body=body,
                   bufs=[memoryview(a.tobytes()) for a in arrays],
                   buf_meta=[(str(a.dtype), a.shape) for a in arrays])


@pytest.fixture
def client(tmp_path):
    inbox: queue.Queue[Message] = queue.Queue()
    log = EventLog(tmp_path / "a.jsonl", "r", "a")
    c = StoreClient(Node(), inbox, log, chunk_bytes=1024, probe_interval_s=60, max_blob_bytes=1 << 20)
    yield c, inbox, tmp_path / "a.jsonl"
    log.close()


def test_a_reply_from_a_member_is_rejected_and_logged_the_stores_is_taken(client):
    c, inbox, log = client
    rid = c._new_id("fr")
    inbox.put(reply("b", "ckpt_frontier", {"req": rid, "manifest_hash": None}))  # an insider answers first
    inbox.put(reply("store", "ckpt_frontier", {"req": rid, "manifest_hash": None}))
    got = c._wait((rid,), time.monotonic() + 5, "frontier")
    assert got.src == "store" and c.foreign_replies == 1
    ev = [e for e in read_events(log) if e["event"] == "store_reply_rejected"]
    assert len(ev) == 1 and ev[0]["src"] == "b" and ev[0]["req"] == rid


@pytest.mark.parametrize("total", [1 << 40, -1, "12", True])
def test_a_blob_size_beyond_the_bound_is_refused_before_anything_is_allocated(client, total):
    c, inbox, _ = client
    sha = "ab" * 32

    def answer(dest, kind, cls, body, arrays=(), reliable=True) -> int:  # the "store" names a size
        inbox.put(reply("store", "ckpt_blob_part", {"req": body["req"], "sha256": sha, "offset": 0, "total": total},
                        (np.zeros(4, dtype=np.uint8),)))
        return 1

    c.node.send = answer
    with pytest.raises(StoreError, match=r"gives its size as .*not a size in \[0, 1,048,576\] bytes"):
        c.fetch_blob(sha, time.monotonic() + 5)
