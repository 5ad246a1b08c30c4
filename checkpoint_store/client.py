"""Client side of the checkpoint store, used inside a site process over its WAN route "store".

    inbox = node.inbox(*StoreClient.KINDS)      # before node.start()
    node.start()
    client = StoreClient(node, inbox, log, chunk_bytes=cfg.wan.chunk_bytes)
    h, manifest = client.save({"model": model.state_dict()}, {"run_id": ..., "ckpt_id": ..., ...}, timeout_s=60)
    h, manifest = client.frontier(timeout_s=10)
    tensors = client.load(manifest, timeout_s=60)

Tensors travel as safetensors bytes (never pickle): each named tensor dict becomes one blob,
addressed by its sha256, uploaded in chunks of traffic class "checkpoint". Chunks are sent with
a bounded number of unacknowledged messages in flight, so a slow link does not buffer a whole
checkpoint in ZeroMQ. Replies are matched by request id; replies to requests this client is no
longer waiting for (e.g. from before a store restart) are dropped.

A request the store had acknowledged when it was killed is never answered: the restarted store
knows nothing of it (one not yet acknowledged is resent to the new store, which answers it). Every
message, acks included, carries its sender's incarnation, so a waiting request fails (StoreError)
as soon as the client hears from a store process other than the one that acknowledged it; a wait
with no reply for `probe_interval_s` asks the store for its frontier, so a new process is heard
from. Without this a request cut by a store restart waited out its whole deadline (120 s), and the
epoch change waiting for it too (soak seed 1015, stall).

A StoreClient is not thread-safe: use it from one thread at a time, and give it its own inbox.
"""

from __future__ import annotations

import hashlib
import itertools
import queue
import time
import uuid
from typing import Any

import numpy as np
import safetensors.torch
import torch

from checkpoint_store.blobstore import CorruptCheckpoint, StoreError, manifest_hash
from wan.frames import Message
from wan.node import WanNode
from ground.eventlog import EventLog

CLS = "checkpoint"


# The largest blob a reply may announce before the client allocates room for it (a reply's `total` is
# the store's word; an insider's reply could name any size). A site's model and optimizer state is a few
# MB here; 4 GiB leaves room for far larger models.
MAX_BLOB_BYTES = 1 << 32

class StoreClient:
    KINDS = ("ckpt_blob_ok", "ckpt_durable", "ckpt_frontier", "ckpt_blob_part", "ckpt_error")

    def __init__(
        self,
        node: WanNode,
        inbox: queue.Queue[Message],
        log: EventLog,
        chunk_bytes: int,
        *,
        dest: str = "store",
        window: int = 8,
        probe_interval_s: float = 2.0,
        max_blob_bytes: int = MAX_BLOB_BYTES,
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.node = node
        self.inbox = inbox
        self.log = log
        # A chunk plus its header must fit the transport's frame limit.
        self.chunk_bytes = min(int(chunk_bytes), node.wan.max_frame_bytes - node.wan.max_header_bytes)
        self.dest = dest
        self.window = max(1, int(window))  # unacked messages to the store before the next chunk waits
        self._prefix = f"{node.name}-{uuid.uuid4().hex[:12]}"
        self._ids = itertools.count(1)
        self._waiting: set[str] = set()
        self._replies: dict[str, Message] = {}
        self.stale_replies = 0
        self.foreign_replies = 0  # replies from a process other than the store (rejected, logged)
        self.max_blob_bytes = int(max_blob_bytes)
        self.probe_interval_s = float(probe_interval_s)
        self._seq_of: dict[str, int] = {}  # request id -> the WAN seq of its latest message
        self._probe: str | None = None  # the request id of the frontier probe in flight

    # ------------------------------------------------------------------ plumbing
    def _new_id(self, what: str) -> str:
        rid = f"{self._prefix}-{what}{next(self._ids)}"
        self._waiting.add(rid)
        return rid

    def _done(self, *rids: str) -> None:
        for r in rids:
            self._waiting.discard(r)
            self._replies.pop(r, None)
            self._seq_of.pop(r, None)

    def _send(self, kind: str, body: dict[str, Any], arrays: tuple[np.ndarray, ...] = ()) -> None:
        seq = self.node.send(self.dest, kind, CLS, body, arrays, reliable=True)
        rid = body.get("req")
        if isinstance(rid, str) and rid in self._waiting:
            self._seq_of[rid] = seq

    def _node_check(self) -> None:
        check = getattr(self.node, "check", None)  # raises if the node's I/O thread died
        if check is not None:
            try:
                check()
            except RuntimeError as e:
                raise StoreError(f"cannot reach the store: {e}") from e

    def _pump(self, timeout_s: float) -> None:
        """Take at most one message off the inbox (waiting up to timeout_s) and file it by request id."""
        self._node_check()
        try:
            msg = self.inbox.get(timeout=max(0.0, timeout_s)) if timeout_s > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return
        rid = msg.body.get("req")
        if msg.src != self.dest:
            # Only the store answers store requests: a member that learned a request id (or guessed one)
            # must not be able to answer it, with a manifest or a blob of its own.
            self.foreign_replies += 1
            self.log.emit("store_reply_rejected", reason="not from the store", src=msg.src, kind=msg.kind,
                          req=rid if isinstance(rid, str) else None)
        elif isinstance(rid, str) and rid in self._waiting:
            self._replies[rid] = msg
        else:
            self.stale_replies += 1

    def _check(self, rids: tuple[str, ...]) -> Message | None:
        for r in rids:
            msg = self._replies.pop(r, None)
            if msg is not None:
                if msg.kind == "ckpt_error":
                    self._done(*rids)
                    raise StoreError(f"store refused {r}: {msg.body.get('reason')}")
                return msg
        return None

    def _lost_with_restart(self, rids: tuple[str, ...]) -> str | None:
        """Why the requests `rids` can no longer be answered (the store they went to has been
        replaced by a new incarnation), or None."""
        now = self.node.peer_incarnation(self.dest)
        for r in rids:
            seq = self._seq_of.get(r)
            took = None if seq is None else self.node.acked_by(self.dest, seq)
            if took is not None and now is not None and took != now:
                return (f"the store restarted (the process that took the request, incarnation {took:x}, is "
                        f"gone; {now:x} answers now): the request was lost with it")
        return None

    def _wait(self, rids: tuple[str, ...], deadline: float, what: str) -> Message:
        """The first reply to any of `rids`; StoreError on ckpt_error, when the store that was sent the
        request has been replaced by a new incarnation, or when the deadline passes."""
        quiet_since = time.monotonic()
        while True:
            msg = self._check(rids)
            if msg is not None:
                return msg
            lost = self._lost_with_restart(rids)
            if lost is not None:
                self._done(*rids)
                raise StoreError(f"{what}: {lost}")
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                self._done(*rids)
                raise StoreError(f"timed out waiting for the store ({what})")
            if self._probe is not None and self._probe in self._replies:
                self._done(self._probe)  # answered: its only use was the incarnation it came from
                self._probe, quiet_since = None, now
            if now - quiet_since >= self.probe_interval_s:
                self._send_probe()
                quiet_since = now
            self._pump(min(left, 0.2))

    def _send_probe(self) -> None:
        """Ask the store for its frontier, only to hear which store process answers. Unreliable: an
        acked probe would count as ack progress toward the store and keep the WAN node from ever
        resending a request that is stuck unacked (its resend timer waits for a quiet destination;
        equal-work v2, s5-store-outage: a stopped store's reply never came and the probes' acks
        starved the resend for 64 s). A lost probe is replaced by the next one."""
        if self._probe is not None:
            self._done(self._probe)
        self._probe = self._new_id("probe")
        self.node.send(self.dest, "ckpt_frontier_get", CLS, {"req": self._probe}, reliable=False)

    # ------------------------------------------------------------------ save
    def _upload(self, data: bytes, sha: str, deadline: float) -> None:
        upload = self._new_id("up")
        arr = np.frombuffer(data, dtype=np.uint8)
        try:
            for off in range(0, max(len(arr), 1), self.chunk_bytes):
                while self.node.unacked(self.dest) >= self.window:
                    self._check((upload,))  # a refused chunk ends the upload early
                    if time.monotonic() > deadline:
                        raise StoreError(f"timed out uploading blob {sha} at offset {off} of {len(arr)}")
                    self._pump(0.005)
                self._check((upload,))
                self._send("ckpt_chunk", {"req": upload, "upload": upload, "offset": off, "sha256": sha},
                           (arr[off:off + self.chunk_bytes],))
                # WanNode.unacked() counts a message only once its I/O thread has moved it out of the
                # outbox; yield the GIL so it does, or this loop races ahead of the window.
                time.sleep(0.0005)
            fin = self._new_id("fin")
            self._send("ckpt_finish", {"req": fin, "upload": upload, "sha256": sha})
            reply = self._wait((fin, upload), deadline, f"finishing blob {sha}")
            if reply.kind != "ckpt_blob_ok" or reply.body.get("sha256") != sha:
                raise StoreError(f"unexpected reply {reply.kind} {reply.body} to finishing blob {sha}")
            self._done(fin)
        finally:
            self._done(upload)

    def save(
        self, blobs: dict[str, dict[str, torch.Tensor]], manifest_fields: dict[str, Any], timeout_s: float
    ) -> tuple[str, dict[str, Any]]:
        """Upload every blob, then the manifest; returns (manifest_hash, manifest) once the store made it durable.

        `manifest_fields` supplies run_id, ckpt_id, round, step, epoch, parent, samples (and any extra
        fields); `blobs` and `created_wall_ns` are filled in here. Raises StoreError on refusal or timeout.
        """
        deadline = time.monotonic() + timeout_s
        with self.log.span("checkpoint_save", ckpt_id=manifest_fields.get("ckpt_id"),
                           round=manifest_fields.get("round")) as info:
            encoded: dict[str, tuple[bytes, str]] = {}
            for name, tensors in blobs.items():
                data = safetensors.torch.save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
                encoded[name] = (data, hashlib.sha256(data).hexdigest())
            uploaded: set[str] = set()
            for _name, (data, sha) in encoded.items():
                if sha not in uploaded:  # identical blobs travel once
                    self._upload(data, sha, deadline)
                    uploaded.add(sha)
            manifest = dict(manifest_fields)
            manifest["blobs"] = {name: sha for name, (_d, sha) in encoded.items()}
            manifest["created_wall_ns"] = time.time_ns()
            local_hash = manifest_hash(manifest)
            req = self._new_id("man")
            self._send("ckpt_manifest", {"req": req, "manifest": manifest})
            reply = self._wait((req,), deadline, "manifest to become durable")
            self._done(req)
            if reply.kind != "ckpt_durable":
                raise StoreError(f"unexpected reply {reply.kind} {reply.body} to a manifest")
            h = reply.body.get("manifest_hash")
            if h != local_hash:
                raise StoreError(f"store acknowledged manifest {h}, but it hashes to {local_hash} here")
            info.update(manifest_hash=h, bytes=sum(len(d) for d, _ in encoded.values()),
                        bytes_uploaded=sum(len(d) for d, s in encoded.values() if s in uploaded),
                        blobs=manifest["blobs"])
            return h, manifest

    # ------------------------------------------------------------------ read
    def frontier(self, timeout_s: float) -> tuple[str, dict[str, Any]] | None:
        """(hash, manifest) of the store's durable frontier, or None if it has none yet."""
        return self._manifest_request({}, timeout_s)

    def checkpoint(self, manifest_hash: str, timeout_s: float) -> dict[str, Any]:
        """The manifest of one named checkpoint (frontier or older), verified by the store and here.
        StoreError (ckpt_error) if the store does not hold it intact."""
        got = self._manifest_request({"manifest_hash": manifest_hash}, timeout_s)
        if got is None or got[0] != manifest_hash:
            raise StoreError(f"asked the store for checkpoint {manifest_hash}, got {got[0] if got else None}")
        return got[1]

    def _manifest_request(self, extra: dict[str, Any], timeout_s: float) -> tuple[str, dict[str, Any]] | None:
        req = self._new_id("fr")
        self._send("ckpt_frontier_get", {"req": req, **extra})
        reply = self._wait((req,), time.monotonic() + timeout_s, "frontier")
        self._done(req)
        if reply.kind != "ckpt_frontier":
            raise StoreError(f"unexpected reply {reply.kind} {reply.body} to a frontier request")
        h, manifest = reply.body.get("manifest_hash"), reply.body.get("manifest")
        if h is None:
            return None
        actual = manifest_hash(manifest)
        if actual != h:
            raise CorruptCheckpoint(f"store:manifests/{h}.json (as received)", h, actual, what="manifest")
        return h, manifest

    def fetch_blob(self, sha: str, deadline: float) -> bytes:
        """Fetch one blob in ranges (a few requests in flight) and verify its sha256."""
        first = self._new_id("get")
        self._send("ckpt_blob_get", {"req": first, "sha256": sha, "offset": 0, "length": self.chunk_bytes})
        part = self._wait((first,), deadline, f"blob {sha}")
        self._done(first)
        if part.kind != "ckpt_blob_part" or part.body.get("sha256") != sha or part.body.get("offset") != 0:
            raise StoreError(f"unexpected reply {part.kind} {part.body} to a request for blob {sha}")
        total = part.body.get("total")
        if isinstance(total, bool) or not isinstance(total, int) or not 0 <= total <= self.max_blob_bytes:
            raise StoreError(f"the store's reply for blob {sha} gives its size as {total!r}: not a size in "
                             f"[0, {self.max_blob_bytes:,}] bytes (max_blob_bytes); nothing was allocated")
        buf = bytearray(total)
        got = part.array(0)
        buf[: len(got)] = got.tobytes()
        received = len(got)
        offsets = iter(range(len(got), total, self.chunk_bytes))
        inflight: dict[str, int] = {}
        while True:
            while len(inflight) < self.window:
                off = next(offsets, None)
                if off is None:
                    break
                rid = self._new_id("get")
                inflight[rid] = off
                self._send("ckpt_blob_get", {"req": rid, "sha256": sha, "offset": off,
                                             "length": min(self.chunk_bytes, total - off)})
            if not inflight:
                break
            try:
                msg = self._wait(tuple(inflight), deadline, f"blob {sha}")
            except StoreError:
                self._done(*inflight)
                raise
            rid = msg.body["req"]
            off = inflight.pop(rid)
            self._done(rid)
            data = msg.array(0)
            if msg.body.get("offset") != off or off + len(data) > total or len(data) == 0:
                self._done(*inflight)
                raise StoreError(f"blob {sha}: bad part at offset {msg.body.get('offset')} ({len(data)} bytes)")
            buf[off:off + len(data)] = data.tobytes()
            received += len(data)
        if received != total:
            raise StoreError(f"blob {sha}: received {received} of {total} bytes")
        actual = hashlib.sha256(buf).hexdigest()
        if actual != sha:
            raise CorruptCheckpoint(f"store:blobs/{sha} (as received)", sha, actual, what="blob")
        return bytes(buf)

    def load(self, manifest: dict[str, Any], timeout_s: float) -> dict[str, dict[str, torch.Tensor]]:
        """Fetch and verify every blob of a manifest; returns {blob name: {tensor name: tensor}} on CPU."""
        deadline = time.monotonic() + timeout_s
        with self.log.span("checkpoint_load", ckpt_id=manifest.get("ckpt_id"), round=manifest.get("round")) as info:
            raw: dict[str, bytes] = {}
            out: dict[str, dict[str, torch.Tensor]] = {}
            for name, sha in manifest["blobs"].items():
                if sha not in raw:
                    raw[sha] = self.fetch_blob(sha, deadline)
                out[name] = safetensors.torch.load(raw[sha])
            info.update(manifest_hash=manifest_hash(manifest), bytes=sum(len(b) for b in raw.values()))
            return out
