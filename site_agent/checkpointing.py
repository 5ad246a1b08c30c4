"""The leader's checkpoints: a copy of the state after a round, uploaded to the store (in the
background while the next round computes), then announced to the coordinator as durable.

`Checkpointer` owns the upload thread and the last manifest it wrote; the site hands it the state to
write at each call (the trainer, the retained samples, the epoch, the plan's frontier).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from checkpoint_store.blobstore import StoreError
from ground.config import RunConfig, to_dict
from ground.schedule import ids_at
from ground.topology import COORD
from site_agent.background import OneAtATime
from site_agent.state import samples_sha256, with_lineage
from wan.frames import TrafficClass

CONTROL = TrafficClass.CONTROL.value


class Checkpointer:
    """Checkpoint writes of one site's leader. store: the site's StoreClient, or None (no store: a
    checkpoint is a no-op). One upload at a time, in order; every other use of the store, a new epoch
    and the site's end first `wait()` for it."""

    def __init__(self, cfg: RunConfig, log: Any, node: Any, store: Any, corpus: Any, order: np.ndarray) -> None:
        self.cfg, self.log, self.node, self.store, self.corpus, self.order = cfg, log, node, store, corpus, order
        self.uploads = OneAtATime("checkpoint-upload")
        self.last_manifest: str | None = None  # the manifest this site wrote last, and in which epoch
        self.last_manifest_epoch = -1

    def wait(self) -> None:
        """Until the upload in flight (if any) is done."""
        self.uploads.wait()

    def checkpoint(self, rnd: int, cursor: int, *, trainer: Any, retained: np.ndarray, epoch: int,
                   frontier_manifest: str | None, step: int, background: bool = False) -> None:
        """Write the state after round `rnd` (samples [0, cursor); `step` inner steps taken) to the store;
        tell the coordinator. The parent is the plan's frontier manifest, or this site's own last one
        when it wrote one in this epoch.

        background: the state is copied now and uploaded by a thread while the next round computes
        (the round loop's periodic checkpoints)."""
        if self.store is None:
            return
        self.uploads.wait()
        parent = self.last_manifest if self.last_manifest and self.last_manifest_epoch == epoch else frontier_manifest
        # A copy of the state (AdamW's tensors are live otherwise) and of what describes it, as of now.
        state = {g: {k: v.clone() for k, v in d.items()} for g, d in trainer.state_tensors().items()}
        what = (rnd, cursor, parent, with_lineage(state, retained), retained.copy(), trainer.params_hash(), epoch, step)
        if background:
            self.uploads.start(lambda: self._upload(*what))
        else:
            self._upload(*what)

    def _upload(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
                ids: np.ndarray, phash: str, epoch: int, step: int) -> None:
        try:
            mhash = self._write(rnd, cursor, parent, blobs, ids, phash, epoch, step)
        except StoreError as e:
            # Refused (a newer epoch fenced the store while we wrote: we are being replaced) or the
            # store was out of reach: this checkpoint is not durable and nothing else is lost. Train
            # on; a newer epoch is adopted at the next boundary, and the next checkpoint tries again.
            self.log.emit("checkpoint_failed", round=rnd, reason=str(e))
            return
        self.last_manifest, self.last_manifest_epoch = mhash, epoch
        self.node.send(COORD, "checkpoint_durable", CONTROL, {"manifest_hash": mhash, "round": rnd, "cursor": cursor})

    def _write(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
               ids: np.ndarray, phash: str, epoch: int, step: int) -> str:
        """Write the state and the retained samples; the span logs both the retained samples' hash
        (`samples_sha256`, the matched-frontier hash) and the canonical prefix's (`canonical_sha256`,
        the first `cursor` positions of the canonical order), which agree in a correct run."""
        cfg = self.cfg
        samples_sha = samples_sha256(ids)
        canonical_sha = samples_sha256(np.asarray(ids_at(self.order, range(0, cursor)), dtype=np.int64))
        with self.log.span("checkpoint_write", round=rnd) as sp:
            sp.update(samples_sha256=samples_sha, canonical_sha256=canonical_sha, samples=int(ids.size), cursor=cursor)
            mhash, _manifest = self.store.save(blobs, {
                "run_id": cfg.run_id, "ckpt_id": f"e{epoch}r{rnd}", "round": rnd, "step": step,
                "epoch": epoch, "parent": parent, "samples": int(ids.size), "samples_sha256": samples_sha,
                "canonical_sha256": canonical_sha, "cursor": cursor, "useful_tokens": int(ids.size) * cfg.model.seq_len,
                "params_hash": phash, "dataset_id": self.corpus.dataset_id,
                "config": to_dict(cfg)}, timeout_s=120.0)
            sp.update(manifest_hash=mhash, useful_tokens=int(ids.size) * cfg.model.seq_len)
        return mhash
