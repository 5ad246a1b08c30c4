"""The checkpoint store's limits against a member that holds a cluster key (issue 54): uploads are the
sender's own and capped per sender and in all, a byte quota with a clear error, a manifest's blob list
capped and each distinct blob hashed once, and repeated frontier probes that stat instead of
rehashing. A real BlobStore on disk and the service's handler with a stand-in for the WAN node (pure
logic: no sockets)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import checkpoint_store.blobstore as blobstore
from checkpoint_store.blobstore import MAX_MANIFEST_BLOBS, MAX_OPEN_UPLOADS, BlobStore, StoreError
from checkpoint_store.service import UPLOADS_PER_SOURCE, StoreService
from ground.eventlog import EventLog
from ground.journal import AnnouncedEpochs
from tests.unit.test_store_read_window import NodeStandIn
from wan.frames import Message


def _manifest(blobs: dict[str, str]) -> dict:
    return {"run_id": "r", "ckpt_id": "c1", "round": 1, "step": 4, "epoch": 1, "parent": None, "samples": 8,
            "blobs": blobs, "created_wall_ns": 1}


def test_an_upload_past_the_quota_is_refused_by_name_and_what_is_stored_stays(tmp_path: Path) -> None:
    store = BlobStore(tmp_path, quota_bytes=100)
    sha = store.put_blob(b"a" * 60)
    h = store.put_manifest(_manifest({"model": sha}))
    with pytest.raises(StoreError, match=r"quota of 100 bytes would be exceeded \(60 held, 60 more\)"):
        store.put_blob(b"b" * 60)
    assert store.frontier() == (h, _manifest({"model": sha})) and store.get_blob(sha) == b"a" * 60
    assert list((tmp_path / "blobs").iterdir()) == [tmp_path / "blobs" / sha]
    assert BlobStore(tmp_path, quota_bytes=100).put_blob(b"c" * 40)  # a restarted store counts what it holds


def test_uploads_in_progress_are_capped_in_all(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    for i in range(MAX_OPEN_UPLOADS):
        store.begin_upload(f"u{i}")
    with pytest.raises(StoreError, match=f"at most {MAX_OPEN_UPLOADS}: finish or abort one first"):
        store.begin_upload("one-more")
    assert store.abort_upload("u0")
    store.begin_upload("one-more")  # room again


def test_a_manifest_lists_a_bounded_number_of_blobs_and_each_distinct_one_is_hashed_once(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    store = BlobStore(tmp_path)
    sha = store.put_blob(b"w" * 1000)
    with pytest.raises(StoreError, match=f"lists {MAX_MANIFEST_BLOBS + 1} blobs, at most {MAX_MANIFEST_BLOBS}"):
        store.put_manifest(_manifest({f"n{i}": sha for i in range(MAX_MANIFEST_BLOBS + 1)}))
    hashed: list[Path] = []
    real = blobstore._sha256_file
    monkeypatch.setattr(blobstore, "_sha256_file", lambda p: hashed.append(p) or real(p))
    h = store.put_manifest(_manifest({f"n{i}": sha for i in range(MAX_MANIFEST_BLOBS)}))
    assert [p.name for p in hashed] == [sha]  # 64 names, one blob: one hash
    hashed.clear()
    store.checkpoint(h)
    assert len(hashed) == 1


def test_a_frontier_probe_within_the_cache_age_stats_instead_of_rehashing_but_sees_a_changed_file(
        tmp_path: Path, monkeypatch) -> None:
    store = BlobStore(tmp_path)
    sha = store.put_blob(b"w" * 1000)
    store.put_manifest(_manifest({"model": sha}))
    hashed: list[Path] = []
    real = blobstore._sha256_file
    monkeypatch.setattr(blobstore, "_sha256_file", lambda p: hashed.append(p) or real(p))
    for _ in range(5):
        store.frontier(max_age_s=60)
    assert hashed == []  # verified when the manifest was stored, unchanged since
    store.frontier()
    assert len(hashed) == 1  # the default always hashes
    (tmp_path / "blobs" / sha).write_bytes(b"x" * 1001)  # another size: the file changed
    with pytest.raises(blobstore.CorruptCheckpoint):
        store.frontier(max_age_s=60)


def _chunk(src: str, upload: str, data: bytes, offset: int = 0) -> Message:
    return Message(kind="ckpt_chunk", cls="checkpoint", run="r", epoch=1, step=0, src=src, inc=1, seq=1,
                   body={"upload": upload, "offset": offset}, bufs=[memoryview(data)],
                   buf_meta=[("uint8", (len(data),))])


def _finish(src: str, upload: str, sha: str) -> Message:
    return Message(kind="ckpt_finish", cls="checkpoint", run="r", epoch=1, step=0, src=src, inc=1, seq=2,
                   body={"req": f"{src}-f", "upload": upload, "sha256": sha})


@pytest.fixture
def service(tmp_path: Path):
    node = NodeStandIn()
    journal = tmp_path / "journal.jsonl"
    journal.write_text('{"type": "epoch", "epoch": 1}\n')
    log = EventLog(tmp_path / "store.jsonl", "r", "store")
    svc = StoreService(node=node, store=BlobStore(tmp_path / "store"), log=log, run_id="r",
                       epochs=AnnouncedEpochs(journal))
    yield svc, node
    log.close()


def test_an_upload_is_its_senders_own_another_member_cannot_finish_or_extend_it(service) -> None:
    svc, node = service
    data = b"honest bytes"
    sha = hashlib.sha256(data).hexdigest()
    svc.handle(_chunk("a", "up1", data[:6]))
    svc.handle(_chunk("evil", "up1", data[6:], offset=6))  # the same id from another sender: its own, unknown
    svc.handle(_finish("evil", "up1", sha))
    assert [(d, k) for d, k, _ in node.sent] == [("evil", "ckpt_error"), ("evil", "ckpt_error")]
    svc.handle(_chunk("a", "up1", data[6:], offset=6))
    svc.handle(_finish("a", "up1", sha))
    assert node.sent[-1][:2] == ("a", "ckpt_blob_ok") and svc.store.get_blob(sha) == data


def test_a_sender_has_a_bounded_number_of_uploads_in_progress(service) -> None:
    svc, node = service
    for i in range(UPLOADS_PER_SOURCE):
        svc.handle(_chunk("evil", f"u{i}", b"x"))
    assert node.sent == []
    svc.handle(_chunk("evil", "one-more", b"x"))
    (dest, kind, body), = node.sent
    assert (dest, kind) == ("evil", "ckpt_error")
    assert f"evil has {UPLOADS_PER_SOURCE} uploads in progress, at most {UPLOADS_PER_SOURCE}" in body["reason"]
    svc.handle(_chunk("a", "u0", b"x"))  # another sender is not affected
    assert len(node.sent) == 1


def test_only_the_epochs_leader_may_put_a_manifest_so_no_other_member_moves_the_frontier(service, tmp_path) -> None:
    """A manifest moves the store's FRONTIER, the state a later run or study starts from (issue 54): the
    store reads each epoch's leader (its plan's first member) from the coordinator's journal and refuses
    a manifest from anyone else, leaving the frontier where it was."""
    svc, node = service
    with open(tmp_path / "journal.jsonl", "a") as f:
        f.write('{"type": "epoch", "epoch": 2, "plan": {"members": ["b", "a", "c"]}}\n')
    sha = svc.store.put_blob(b"w" * 100)

    def put(src: str, ckpt_id: str) -> None:
        svc.handle(Message(kind="ckpt_manifest", cls="checkpoint", run="r", epoch=2, step=0, src=src, inc=1, seq=3,
                           body={"req": f"{src}-m", "manifest": dict(_manifest({"model": sha}), ckpt_id=ckpt_id)}))

    put("c", "forged")
    (dest, kind, body), = node.sent
    assert (dest, kind) == ("c", "ckpt_error") and svc.store.frontier_hash() is None
    assert body["reason"].endswith("only epoch 2's leader (b) checkpoints: a manifest from c is refused"), body
    put("b", "honest")
    assert node.sent[-1][:2] == ("b", "ckpt_durable") and svc.store.frontier()[1]["ckpt_id"] == "honest"
