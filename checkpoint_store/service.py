"""The checkpoint store service: `python -m checkpoint_store.service --run-dir RUN_DIR`.

A process of its own, reached by the sites only over the WAN (through the Toxiproxy proxies
`<site>_to_store`). It stores uploaded safetensors blobs and JSON manifests in a `BlobStore`
under `RUN_DIR/store/`; the durable frontier is the last manifest it acknowledged.

Requests (all replies are traffic class "checkpoint", reliable, sent back to the requester with
the request's epoch, and carry the request's `req`):
    ckpt_chunk        {req?, upload, offset, sha256} + uint8 buffer   -> (nothing; ckpt_error on failure)
    ckpt_finish       {req, upload, sha256}                          -> ckpt_blob_ok {req, sha256, bytes}
    ckpt_manifest     {req, manifest}                                -> ckpt_durable {req, manifest_hash, round}
    ckpt_frontier_get {req, manifest_hash?}                          -> ckpt_frontier {req, manifest_hash, manifest}
                      (the frontier; or the named checkpoint, verified, when manifest_hash is given)
    ckpt_blob_get     {req, sha256, offset, length}                  -> ckpt_blob_part {req, sha256, offset, total} + uint8 buffer
Any failure                                                          -> ckpt_error {req, reason}
A chunk's error reply carries `req` = its `req`, else its upload id. Once an upload was refused
(gap, unknown upload, stale epoch, bad chunk), its later chunks are dropped without a reply until
the writer restarts it at offset 0.

Every body is checked against its typed request (`checkpoint_store/requests.py`) first; a bad
one is answered "bad_request: <reason>" and logged. Nothing in a request stops the store.

Only the leader of the request's epoch (the first member of the coordinator's journaled plan) may
put a manifest: a manifest moves the FRONTIER, and no other member checkpoints.
Fencing: the store durably remembers the highest epoch of any accepted write (chunk, finish,
manifest). A write whose message epoch is lower is refused with reason "stale_epoch: ...". A
write whose epoch the coordinator never announced (above the highest `epoch` record of its
journal, RUN_DIR/coordinator/journal.jsonl, which the coordinator writes before any site hears
of the epoch) is refused with reason "future_epoch: ..." and never raises the fence: a member
that sends epoch 10**9 cannot lock every later writer out.

This module must not import torch: the store only handles bytes.
"""

from __future__ import annotations

import argparse
import collections
import queue
import time
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from checkpoint_store.blobstore import BlobStore, CorruptCheckpoint, StoreError
from checkpoint_store.requests import PARSERS, BlobGet, Chunk, Finish, FrontierGet, ManifestPut, request_id
from ground.journal import AnnouncedEpochs
from ground.resources import peak_rss_mib
from ground.messages import BadMessage
from wan.frames import Message
from wan.node import WanNode
from ground.config import config_from_json
from ground.eventlog import EventLog
from ground.topology import STORE, Topology
from ground.stop_request import watch_stop_request

KINDS = ("ckpt_chunk", "ckpt_finish", "ckpt_manifest", "ckpt_frontier_get", "ckpt_blob_get")
CLS = "checkpoint"
CHUNK_LOG_EVERY = 16
REFUSED_MEMORY = 1024
# Unacked reply bytes the store holds for one requester before it serves that requester's next read:
# 4 x a client's own window (8 chunks of at most 1 MiB).
READ_WINDOW_BYTES = 32 * 1024 * 1024
UPLOADS_PER_SOURCE = 4  # uploads one requester may have in progress at once (a site uploads one at a time)
# A frontier probe trusts a blob's full-hash check this recent (s) while its file is unchanged: the sites
# probe the frontier often, and each probe rehashed every blob of the checkpoint.
VERIFY_CACHE_S = 10.0


class StoreService:
    def __init__(self, *, node: WanNode, store: BlobStore, log: EventLog, run_id: str,
                 epochs: AnnouncedEpochs) -> None:
        self.node = node
        self.epochs = epochs  # what the coordinator announced: the only epochs a write may raise the fence to
        self.store = store
        self.log = log
        self.run_id = run_id
        self._chunks: dict[str, int] = {}  # upload id -> chunks received
        # upload id -> chunks dropped since it was refused (most recent REFUSED_MEMORY uploads)
        self._refused: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._over_window: dict[str, int] = {}  # requester -> blob reads dropped over its read window
        # Largest buffer one reply may carry under the transport's frame limit.
        self.max_part_bytes = max(1, node.wan.max_frame_bytes - node.wan.max_header_bytes)

    # ------------------------------------------------------------------ replies
    def _reply(self, msg: Message, kind: str, body: dict[str, Any], arrays: tuple[np.ndarray, ...] = ()) -> None:
        self.node.send(dest=msg.src, kind=kind, cls=CLS, body=body, arrays=arrays, reliable=True, epoch=msg.epoch)

    def _error(self, msg: Message, req: Any, reason: str) -> None:
        self.log.emit("ckpt_request_failed", kind=msg.kind, src=msg.src, req=req, msg_epoch=msg.epoch, reason=reason)
        self._reply(msg, "ckpt_error", {"req": req, "reason": reason})

    def _fenced(self, msg: Message, req: Any) -> bool:
        """True if the write may proceed; otherwise refuse it (logged, error reply)."""
        current = self.store.fence_epoch()
        reason = None
        if msg.epoch < current:
            reason = f"stale_epoch: request epoch {msg.epoch} < highest accepted write epoch {current}"
        elif msg.epoch > current and msg.epoch > (announced := self.epochs.highest_announced(msg.epoch)):
            reason = (f"future_epoch: request epoch {msg.epoch} was never announced by the coordinator "
                      f"(highest announced {announced})")
        if reason is None:
            return True
        self.log.emit("write_rejected", kind=msg.kind, src=msg.src, req=req, msg_epoch=msg.epoch,
                      fence_epoch=current, reason=reason)
        self._reply(msg, "ckpt_error", {"req": req, "reason": reason})
        return False

    def _accepted(self, msg: Message) -> None:
        if self.store.raise_fence_epoch(msg.epoch):
            self.log.emit("store_fence_raised", fence_epoch=msg.epoch, src=msg.src, kind=msg.kind)

    def _drop_upload(self, upload: Any) -> None:
        if isinstance(upload, str):
            self.store.abort_upload(upload)
            self._chunks.pop(upload, None)

    # ------------------------------------------------------------------ handlers
    def handle(self, msg: Message) -> None:
        req = request_id(msg.kind, msg.body)
        try:
            parse = PARSERS.get(msg.kind)
            if parse is None:
                self._error(msg, req, f"bad_request: unknown kind {msg.kind[:64]!r}")
                return
            typed = parse(msg.body)
            handlers = {"ckpt_chunk": self._on_chunk, "ckpt_finish": self._on_finish,
                        "ckpt_manifest": self._on_manifest, "ckpt_frontier_get": self._on_frontier,
                        "ckpt_blob_get": self._on_blob_get}
            handlers[msg.kind](msg, req, typed)
        except BadMessage as e:
            if msg.kind == "ckpt_chunk" and isinstance(req, str):
                self._refuse_upload_id(self._owned(msg.src, req))
            self._error(msg, req, f"bad_request: {e.reason}")
        except CorruptCheckpoint as e:
            self._error(msg, req, f"corrupt_checkpoint: {e}")
        except StoreError as e:
            self._error(msg, req, f"store_error: {e}")
        except (KeyError, TypeError, ValueError, IndexError) as e:
            self._error(msg, req, f"bad_request: {type(e).__name__}: {e}")
        except OSError as e:
            self._error(msg, req, f"io_error: {type(e).__name__}: {e}")
        except Exception as e:  # a bug here must not take the store down; it is logged and answered
            self._error(msg, req, f"internal_error: {type(e).__name__}: {e}")

    def _refuse_upload_id(self, upload: str) -> None:
        """A malformed chunk: its upload (if the id is one) cannot complete."""
        if isinstance(upload, str) and len(upload) <= 128:
            self._refuse(upload)

    @staticmethod
    def _owned(src: str, upload: str) -> str:
        """The store's id of `src`'s upload `upload`: uploads are the sender's own, so no member can
        append to, finish or refuse another's (ids are the sender's choice)."""
        return f"{src}.{upload}"

    def _on_chunk(self, msg: Message, req: Any, c: Chunk) -> None:
        upload, offset = self._owned(msg.src, c.upload), c.offset
        if offset != 0 and upload in self._refused:
            # The writer was already told this upload failed; later chunks (in flight, or resent
            # by the transport after a reconnect) are dropped without a reply each.
            self._refused[upload] += 1
            return
        try:
            if not self._fenced(msg, req):
                self._refuse(upload)
                return
            if len(msg.bufs) != 1 or msg.buf_meta[0][0] != "uint8":
                raise ValueError(f"a chunk carries exactly one uint8 buffer, got {[m[0] for m in msg.buf_meta]}")
            data = msg.array(0)
            if offset == 0:
                self._refused.pop(upload, None)
                mine = [u for u in self._chunks if u.startswith(msg.src + ".") and u != upload]
                if len(mine) >= UPLOADS_PER_SOURCE:
                    raise StoreError(f"{msg.src} has {len(mine)} uploads in progress, at most {UPLOADS_PER_SOURCE}: "
                                     f"upload {c.upload!r} refused")
                self.store.begin_upload(upload)
                self._chunks[upload] = 0
            self.store.append(upload, offset, data)
        except Exception:
            self._refuse(upload)  # a gap, an unknown upload, a bad chunk: this upload cannot complete
            raise
        self._accepted(msg)
        n = self._chunks.get(upload, 0) + 1
        self._chunks[upload] = n
        if n % CHUNK_LOG_EVERY == 0:
            self.log.emit("ckpt_chunk_received", upload=c.upload, offset=offset, bytes=int(data.size), chunks=n,
                          src=msg.src)

    def _refuse(self, upload: str) -> None:
        self._drop_upload(upload)
        self._refused[upload] = 0
        self._refused.move_to_end(upload)
        while len(self._refused) > REFUSED_MEMORY:
            self._refused.popitem(last=False)

    def _on_finish(self, msg: Message, req: Any, f: Finish) -> None:
        upload, sha = self._owned(msg.src, f.upload), f.sha256
        if not self._fenced(msg, req):
            self._drop_upload(upload)
            return
        self._chunks.pop(upload, None)
        self.store.finish_upload(upload, sha)
        self._accepted(msg)
        self._reply(msg, "ckpt_blob_ok", {"req": req, "sha256": sha, "bytes": self.store.blob_size(sha)})

    def _on_manifest(self, msg: Message, req: Any, mp: ManifestPut) -> None:
        manifest = mp.manifest
        if not self._fenced(msg, req):
            return
        if manifest.get("run_id") != self.run_id:
            raise StoreError(f"manifest run_id {manifest.get('run_id')!r} is not this run ({self.run_id!r})")
        # A manifest moves the store's FRONTIER (the state a later run or study starts from): only the
        # epoch's leader checkpoints (site_core.adoption), so another member's manifest is refused.
        leader = self.epochs.leader_of(msg.epoch)
        if leader is not None and msg.src != leader:
            raise StoreError(f"only epoch {msg.epoch}'s leader ({leader}) checkpoints: a manifest from {msg.src} "
                             f"is refused")
        h = self.store.put_manifest(manifest)
        self._accepted(msg)
        nbytes = sum(self.store.blob_size(s) for s in set(manifest["blobs"].values()))
        self.log.emit("checkpoint_durable", manifest_hash=h, ckpt_id=manifest["ckpt_id"], round=manifest["round"],
                      step=manifest["step"], epoch=msg.epoch, parent=manifest["parent"], bytes=nbytes,
                      blobs=manifest["blobs"], src=msg.src)
        self._reply(msg, "ckpt_durable", {"req": req, "manifest_hash": h, "round": manifest["round"]})

    def _on_frontier(self, msg: Message, req: Any, typed: FrontierGet) -> None:
        if typed.manifest_hash is not None:
            h, manifest = typed.manifest_hash, self.store.checkpoint(typed.manifest_hash, VERIFY_CACHE_S)
        else:
            fr = self.store.frontier(VERIFY_CACHE_S)
            h, manifest = fr if fr is not None else (None, None)
        self._reply(msg, "ckpt_frontier", {"req": req, "manifest_hash": h, "manifest": manifest})

    def _on_blob_get(self, msg: Message, req: Any, g: BlobGet) -> None:
        sha, offset, length = g.sha256, g.offset, g.length
        if length is None or length > self.max_part_bytes:
            length = self.max_part_bytes
        held = self.node.unacked_bytes(msg.src)
        if held + length > READ_WINDOW_BYTES:
            # A requester that does not ack what it was sent is not served until it does: the store
            # would otherwise hold (and resend) every reply it asked for. A genuine client keeps a few
            # chunks in flight (checkpoint_store/client.py `window`), far inside this.
            n = self._over_window[msg.src] = self._over_window.get(msg.src, 0) + 1
            if n == 1 or n % 1000 == 0:
                self.log.emit("ckpt_request_failed", kind=msg.kind, src=msg.src, req=req, msg_epoch=msg.epoch,
                              reason=f"read_window: {held:,} B sent to {msg.src} not acked yet (window "
                                     f"{READ_WINDOW_BYTES:,} B); request {n} over it dropped unanswered")
            return
        data = self.store.get_blob(sha, offset, length)
        total = self.store.blob_size(sha)
        self._reply(msg, "ckpt_blob_part", {"req": req, "sha256": sha, "offset": offset, "total": total},
                    (np.frombuffer(data, dtype=np.uint8),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="checkpoint_store.service", description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    run: Path = args.run_dir
    cfg = config_from_json(run / "config.json")
    topo = Topology.load(run / "topology.json")
    log = EventLog(run / "logs" / "store.jsonl", run_id=cfg.run_id, process=STORE)

    stop = threading.Event()
    stop_reason: list[str] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_reason.append(signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    watch_stop_request(run, STORE)  # the end of a compose run asks through the run directory

    store = BlobStore(run / "store", quota_bytes=cfg.cluster.store_quota_mib * 1024 * 1024)
    removed = store.recover()
    node = WanNode(
        name=STORE,
        run_id=cfg.run_id,
        wan=cfg.wan,
        log=log,
        bind=topo.bind_for(STORE),
        server_links=topo.server_links_for(STORE),
        members=topo.peers_of(STORE),
        keys_dir=str(run / "keys") if cfg.wan.curve else None,
    )
    inbox = node.inbox(*KINDS)
    try:
        node.start()
    except BaseException as e:
        log.emit("store_failed", error=f"{type(e).__name__}: {e}")
        log.close()
        raise
    frontier_hash: str | None = None
    frontier_error: str | None = None
    try:
        fr = store.frontier()
        frontier_hash = fr[0] if fr is not None else None
    except StoreError as e:
        frontier_error = str(e)
    log.emit("store_started", removed=removed, frontier=frontier_hash, frontier_error=frontier_error,
             fence_epoch=store.fence_epoch(), bind=topo.bind_for(STORE), root=str(store.root))
    svc = StoreService(node=node, store=store, log=log, run_id=cfg.run_id,
                       epochs=AnnouncedEpochs(run / "coordinator" / "journal.jsonl"))
    rc = 0
    last_counters = time.monotonic()
    try:
        while not stop.is_set():
            if time.monotonic() - last_counters > 2.0:  # a SIGKILLed store loses at most 2 s of counts
                last_counters = time.monotonic()
                log.emit("wan_counters", counters=node.counters.snapshot())
            try:
                msg = inbox.get(timeout=0.2)
            except queue.Empty:
                crashed = getattr(node, "crashed", None)
                if crashed:  # the WAN I/O thread died: nothing can reach us any more
                    stop_reason.append(f"wan_thread_crashed: {crashed}")
                    rc = 1
                    break
                continue
            svc.handle(msg)
    finally:
        node.close()  # the last counters are read when nothing more can be sent
        log.emit("wan_counters", **node.final_counters())
        log.emit("store_stopped", reason=stop_reason[0] if stop_reason else "exit", peak_rss_mib=peak_rss_mib())
        store.close()
        log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
