"""The leader's checkpoints: a copy of the state after a round, uploaded to the store (in the
background while the next round computes), then announced to the coordinator as durable.

`Checkpointing` holds methods only: `site_agent.agent.Site` owns the state they use.
"""

from __future__ import annotations

import numpy as np
import torch

from checkpoint_store.blobstore import StoreError
from ground.config import to_dict
from ground.schedule import ids_at
from ground.topology import COORD
from site_agent.state import samples_sha256, with_lineage
from wan.frames import TrafficClass

CONTROL = TrafficClass.CONTROL.value


class Checkpointing:
    """Checkpoint writes for Site (state: store, uploads, plan, trainer, retained, order, ...)."""

    def checkpoint(self, rnd: int, cursor: int, background: bool = False) -> None:
        """Leader: write the state after round `rnd` (samples [0, cursor)) to the store; tell the coordinator.

        background: the state is copied now and uploaded by a thread while the next round computes
        (the round loop's periodic checkpoints). One upload at a time, in order; every other use of
        the store, a new epoch and the site's end first wait for it (`self.uploads.wait()`)."""
        if self.store is None:
            return
        self.uploads.wait()
        parent = self.plan.frontier_manifest if self.plan is not None else None
        if getattr(self, "last_manifest", None) and getattr(self, "last_manifest_epoch", -1) == self.epoch:
            parent = self.last_manifest
        # A copy of the state (AdamW's tensors are live otherwise) and of what describes it, as of now.
        state = {g: {k: v.clone() for k, v in d.items()} for g, d in self.trainer.state_tensors().items()}
        what = (rnd, cursor, parent, with_lineage(state, self.retained), self.retained.copy(),
                self.trainer.params_hash(), self.epoch)
        if background:
            self.uploads.start(lambda: self._upload(*what))
        else:
            self._upload(*what)

    def _upload(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
                ids: np.ndarray, phash: str, epoch: int) -> None:
        try:
            mhash = self._write_checkpoint(rnd, cursor, parent, blobs, ids, phash, epoch)
        except StoreError as e:
            # Refused (a newer epoch fenced the store while we wrote: we are being replaced) or the
            # store was out of reach: this checkpoint is not durable and nothing else is lost. Train
            # on; a newer epoch is adopted at the next boundary, and the next checkpoint tries again.
            self.log.emit("checkpoint_failed", round=rnd, reason=str(e))
            return
        self.last_manifest, self.last_manifest_epoch = mhash, epoch
        self.node.send(COORD, "checkpoint_durable", CONTROL, {"manifest_hash": mhash, "round": rnd, "cursor": cursor})

    def _write_checkpoint(self, rnd: int, cursor: int, parent: str | None, blobs: dict[str, dict[str, torch.Tensor]],
                          ids: np.ndarray, phash: str, epoch: int) -> str:
        """Write the state and the retained samples; the span logs both the retained samples' hash
        (`samples_sha256`, the matched-frontier hash) and the canonical prefix's (`canonical_sha256`,
        the first `cursor` positions of the canonical order), which agree in a correct run."""
        cfg = self.cfg
        samples_sha = samples_sha256(ids)
        canonical_sha = samples_sha256(np.asarray(ids_at(self.order, range(0, cursor)), dtype=np.int64))
        assert self.store is not None
        with self.log.span("checkpoint_write", round=rnd) as sp:
            sp.update(samples_sha256=samples_sha, canonical_sha256=canonical_sha, samples=int(ids.size), cursor=cursor)
            mhash, _manifest = self.store.save(blobs, {
                "run_id": cfg.run_id, "ckpt_id": f"e{epoch}r{rnd}", "round": rnd, "step": self.step_at_end.get(rnd, (rnd + 1) * self.spr),
                "epoch": epoch, "parent": parent, "samples": int(ids.size), "samples_sha256": samples_sha,
                "canonical_sha256": canonical_sha, "cursor": cursor, "useful_tokens": int(ids.size) * cfg.model.seq_len,
                "params_hash": phash, "dataset_id": self.corpus.dataset_id,
                "config": to_dict(cfg)}, timeout_s=120.0)
            sp.update(manifest_hash=mhash, useful_tokens=int(ids.size) * cfg.model.seq_len)
        return mhash
