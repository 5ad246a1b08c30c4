"""The checkpoint store's pieces without a process: BlobStore (offsets, hashes, lineage, fencing, torn
uploads), the journal's announced epochs, and the client's probe of a quiet store. The service with real
processes, real ZeroMQ (CURVE) and the real toxiproxy-server: tests/live/test_checkpoint_store.py."""

from __future__ import annotations

import hashlib
import os
import queue
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from checkpoint_store.blobstore import BlobStore, CorruptCheckpoint, StoreError, canonical_json, manifest_hash
from checkpoint_store.client import StoreClient
from ground.journal import AnnouncedEpochs, Journal
from ground.eventlog import EventLog


# ---------------------------------------------------------------------------- BlobStore units


def _blob(tensors: dict[str, torch.Tensor]) -> bytes:
    return safetensors.torch.save(tensors)


def _manifest(store: BlobStore, ckpt_id: str, rnd: int, parent: str | None, **blobs: bytes) -> dict:
    return {
        "run_id": "t1",
        "ckpt_id": ckpt_id,
        "round": rnd,
        "step": rnd * 8,
        "epoch": 0,
        "parent": parent,
        "samples": rnd * 64,
        "blobs": {name: store.put_blob(data) for name, data in blobs.items()},
        "created_wall_ns": time.time_ns(),
    }


def test_put_get_round_trip(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "s")
    assert store.recover() == []
    assert store.frontier() is None
    tensors = {"w": torch.randn(17, 5), "i": torch.arange(9, dtype=torch.int64), "h": torch.randn(3).to(torch.bfloat16)}
    data = _blob(tensors)
    sha = hashlib.sha256(data).hexdigest()
    store.begin_upload("u1")
    for off in range(0, len(data), 100):
        store.append("u1", off, data[off:off + 100])
    assert store.finish_upload("u1", sha) == sha
    assert list((tmp_path / "s" / "tmp").iterdir()) == []
    assert store.get_blob(sha) == data
    assert store.get_blob(sha, 10, 25) == data[10:35]
    assert store.get_blob(sha, 100) == data[100:]
    back = safetensors.torch.load(store.get_blob(sha))
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k].view(torch.uint8), t.view(torch.uint8))
    # Finishing the same content again is idempotent.
    assert store.put_blob(data) == sha

    m = {"run_id": "t1", "ckpt_id": "c1", "round": 1, "step": 8, "epoch": 0, "parent": None, "samples": 64,
         "blobs": {"model": sha}, "created_wall_ns": time.time_ns(), "extra": {"lr": 0.5}}
    h = store.put_manifest(m)
    assert h == manifest_hash(m) == hashlib.sha256(canonical_json(m)).hexdigest()
    assert (tmp_path / "s" / "FRONTIER").read_text().strip() == h
    assert (tmp_path / "s" / "manifests" / f"{h}.json").read_bytes() == canonical_json(m)
    assert store.frontier() == (h, m)
    assert store.manifests() == {h: m}
    # A new BlobStore over the same root sees the same durable state.
    assert BlobStore(tmp_path / "s").frontier() == (h, m)


def test_append_offsets_and_hash_are_checked(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(StoreError, match="unknown upload 'nope'"):
        store.append("nope", 0, b"x")
    with pytest.raises(StoreError, match="bad upload id"):
        store.begin_upload("../escape")
    store.begin_upload("u")
    store.append("u", 0, b"abcd")
    with pytest.raises(StoreError, match=r"chunk at offset 2, but 4 bytes have been received"):
        store.append("u", 2, b"cd")
    with pytest.raises(StoreError, match="hash to"):
        store.finish_upload("u", "0" * 64)
    assert list((tmp_path / "tmp").iterdir()) == []  # a bad upload is discarded
    assert list((tmp_path / "blobs").iterdir()) == []


def test_torn_upload_is_removed_by_recover_and_frontier_unchanged(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    m1 = _manifest(store, "c1", 1, None, model=_blob({"w": torch.randn(8)}))
    h1 = store.put_manifest(m1)
    store.begin_upload("torn")
    store.append("torn", 0, os.urandom(5000))
    # Simulate a crash: the process dies with the upload open; a new process starts on the same root.
    (tmp_path / "tmp" / "write-deadbeef.part").write_bytes(b"half a manifest")
    restarted = BlobStore(tmp_path)
    removed = restarted.recover()
    assert sorted(removed) == ["tmp/upload-torn.part", "tmp/write-deadbeef.part"]
    assert list((tmp_path / "tmp").iterdir()) == []
    assert restarted.frontier() == (h1, m1)
    assert restarted.recover() == []


def test_flipped_byte_in_blob_raises_corrupt_checkpoint_naming_it(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    m = _manifest(store, "c1", 1, None, model=_blob({"w": torch.randn(64)}), opt=_blob({"m": torch.randn(8)}))
    store.put_manifest(m)
    sha = m["blobs"]["model"]
    path = tmp_path / "blobs" / sha
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCheckpoint) as ei:
        store.frontier()
    e = ei.value
    assert e.path == str(path) and e.expected == sha and e.actual == hashlib.sha256(raw).hexdigest()
    assert sha in str(e) and e.actual in str(e)
    with pytest.raises(CorruptCheckpoint):
        store.get_blob(sha)
    with pytest.raises(CorruptCheckpoint):
        store.get_blob(sha, 4, 4)  # a ranged read verifies the whole file too


def test_flipped_byte_in_manifest_raises_corrupt_checkpoint(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    h = store.put_manifest(_manifest(store, "c1", 1, None, model=_blob({"w": torch.randn(4)})))
    path = tmp_path / "manifests" / f"{h}.json"
    path.write_bytes(path.read_bytes().replace(b'"round":1', b'"round":2'))
    with pytest.raises(CorruptCheckpoint) as ei:
        store.frontier()
    assert ei.value.path == str(path) and ei.value.expected == h


def test_manifest_naming_missing_blob_is_refused_and_frontier_unchanged(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    h1 = store.put_manifest(_manifest(store, "c1", 1, None, model=_blob({"w": torch.randn(4)})))
    before = (tmp_path / "FRONTIER").read_bytes()
    m2 = _manifest(store, "c2", 2, h1)
    m2["blobs"] = {"model": "ab" * 32}
    with pytest.raises(StoreError, match=r"blob abab.* is not in the store"):
        store.put_manifest(m2)
    assert (tmp_path / "FRONTIER").read_bytes() == before
    assert store.frontier()[0] == h1
    assert list(store.manifests()) == [h1]
    bad = dict(_manifest(store, "c3", 3, h1))
    del bad["samples"]
    with pytest.raises(StoreError, match=r"lacks required field\(s\) \['samples'\]"):
        store.put_manifest(bad)
    with pytest.raises(StoreError, match="'samples' must be"):
        store.put_manifest(dict(bad, samples="many"))
    with pytest.raises(StoreError, match="'round' must be"):
        store.put_manifest(dict(bad, samples=1, round=-1))
    assert (tmp_path / "FRONTIER").read_bytes() == before
    # `samples` may also be a mapping describing the retained samples (count, tokens, hash of the ids).
    h4 = store.put_manifest(dict(bad, samples={"count": 3, "tokens": 384, "sha256": "00" * 32}))
    assert store.frontier()[0] == h4


def test_lineage_parent_must_exist_and_branches_are_kept(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    h1 = store.put_manifest(_manifest(store, "c1", 1, None, model=_blob({"w": torch.randn(4)})))
    with pytest.raises(StoreError, match="parent .* does not exist"):
        store.put_manifest(_manifest(store, "cx", 2, "cd" * 32, model=_blob({"w": torch.randn(4)})))
    with pytest.raises(StoreError, match="parent"):
        store.put_manifest(_manifest(store, "cy", 2, "not-a-hash", model=_blob({"w": torch.randn(4)})))
    assert store.frontier()[0] == h1
    h2 = store.put_manifest(_manifest(store, "c2", 2, h1, model=_blob({"w": torch.randn(4)})))
    # A rollback: a new branch from c1; c2 stays in the lineage tree as an abandoned branch.
    h3 = store.put_manifest(_manifest(store, "c3", 2, h1, model=_blob({"w": torch.randn(4)})))
    assert store.frontier()[0] == h3
    tree = store.manifests()
    assert set(tree) == {h1, h2, h3}
    assert tree[h2]["parent"] == tree[h3]["parent"] == h1 and tree[h1]["parent"] is None


def test_fence_epoch_is_durable(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    assert store.fence_epoch() == 0
    assert store.raise_fence_epoch(4) is True
    assert store.raise_fence_epoch(2) is False
    assert BlobStore(tmp_path).fence_epoch() == 4


def test_announced_epochs_follow_the_coordinators_journal_as_it_grows(tmp_path: Path) -> None:
    path = tmp_path / "coordinator" / "journal.jsonl"
    epochs = AnnouncedEpochs(path)
    assert epochs.highest_announced(3) == 0  # no journal yet: nothing announced
    j = Journal(path)
    j.append({"type": "epoch", "epoch": 1, "plan": {}})
    j.append({"type": "commit", "epoch": 7, "round": 0})  # a commit record announces nothing
    assert epochs.highest_announced(7) == 1
    with open(path, "a") as f:
        f.write('{"type": "epoch", "epoch": 2')  # a record being written: not read yet
    assert epochs.highest_announced(2) == 1
    with open(path, "a") as f:
        f.write(', "plan": {}}\n')
    assert epochs.highest_announced(2) == 2
    j.close()


def test_a_quiet_wait_probes_the_store_unreliably_and_again_when_a_probe_is_lost(tmp_path: Path) -> None:
    """Pure logic (a recording stand-in for the WAN node). A probe only asks which store process
    answers; sent reliably, its ack would count as ack progress and hold back the resend of a
    request stuck unacked. It is unreliable, and an unanswered one is replaced by the next."""
    sent: list[tuple[str, bool]] = []

    class Node:
        name = "a"
        wan = type("W", (), {"max_frame_bytes": 1 << 20, "max_header_bytes": 4096})()

        def send(self, dest, kind, cls, body, arrays=(), reliable=True, **kw):
            sent.append((kind, reliable))
            return len(sent) if reliable else 0

        def acked_by(self, dest, seq):
            return None

        def peer_incarnation(self, member):
            return None

    client = StoreClient(Node(), queue.Queue(), EventLog(tmp_path / "a.jsonl", run_id="t", process="a"), 1024,
                         probe_interval_s=0.05)
    with pytest.raises(StoreError, match="timed out"):
        client.frontier(timeout_s=0.6)
    assert sent[0] == ("ckpt_frontier_get", True)  # the request itself
    probes = sent[1:]
    assert len(probes) >= 2 and set(probes) == {("ckpt_frontier_get", False)}  # one per 0.2 s poll here
    assert len(client._waiting) <= 1  # lost probes are forgotten, not piled up
