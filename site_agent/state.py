"""Snapshots of a site's training state, and loading state that came from elsewhere.

A snapshot is taken at the start of every round (the state after the previous round), so when
a new membership epoch says "resume at round r" a site rolls back to exactly that state: the
work of an aborted round is discarded, never half-applied. The same blob layout
(`model`, `inner_optim`, `outer` tensor dicts, as `SiteTrainer.state_tensors` writes it) serves
checkpoints in the store and peer state transfer.

A snapshot also holds the samples the lineage retained up to that state (`retained`, sorted
int64 sample ids, a multiset): rolling back rolls them back too. In checkpoints and state
transfers they travel as the blob `lineage` (tensor `retained_ids`), beside the training state;
`samples_sha256` is the sha256 of those ids as little-endian int64, the matched-frontier hash.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from site_agent.model import load_flat_params_

if TYPE_CHECKING:  # annotations only: the trainer loads a start state through this module
    from site_agent.trainer import SiteTrainer


LINEAGE = "lineage"  # the blob that carries the retained sample ids
RETAINED = "retained_ids"


def _no_ids() -> np.ndarray:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Snapshot:
    round: int  # the state at the start of this round
    blobs: dict[str, dict[str, torch.Tensor]]
    params_hash: str
    retained: np.ndarray = field(default_factory=_no_ids)  # int64 [k], sorted: samples retained up to here


def take_snapshot(trainer: SiteTrainer, rnd: int, retained: np.ndarray | None = None,
                  params_hash: str | None = None) -> Snapshot:
    """The trainer's state now. `params_hash`: the hash of exactly this state when the caller has just
    computed it (the round loop has: the hash it logged after applying the previous round); else computed."""
    blobs = {g: {k: v.clone() for k, v in d.items()} for g, d in trainer.state_tensors().items()}
    ids = _no_ids() if retained is None else np.array(retained, dtype=np.int64)
    return Snapshot(rnd, blobs, params_hash if params_hash is not None else trainer.params_hash(), ids)


def samples_sha256(ids: np.ndarray) -> str:
    """sha256 of sorted sample ids as little-endian int64: the matched-frontier hash."""
    return hashlib.sha256(np.sort(np.asarray(ids, dtype="<i8")).tobytes()).hexdigest()


def merge_retained(retained: np.ndarray, new: np.ndarray) -> np.ndarray:
    """The retained multiset with one more round's ids added (sorted int64)."""
    return np.sort(np.concatenate([np.asarray(retained, dtype=np.int64), np.asarray(new, dtype=np.int64)]))


def with_lineage(blobs: dict[str, dict[str, torch.Tensor]], retained: np.ndarray) -> dict[str, dict[str, torch.Tensor]]:
    """The training state plus the `lineage` blob holding the retained sample ids."""
    return {**blobs, LINEAGE: {RETAINED: torch.from_numpy(np.array(retained, dtype=np.int64))}}


def retained_of(blobs: dict[str, dict[str, torch.Tensor]], what: str, want_sha: str | None) -> np.ndarray:
    """The retained ids a checkpoint or a donor's state carries, checked against the announced hash.

    Raises ValueError, saying which, when the state carries none, carries ids that are not a 1-D
    int64 tensor of non-negative ids, or carries ids whose hash is not the announced one.
    """
    t = blobs.get(LINEAGE, {}).get(RETAINED)
    if t is None:
        raise ValueError(f"{what} carries no retained sample ids (blob {LINEAGE!r}, tensor {RETAINED!r})")
    if t.dtype != torch.int64 or t.dim() != 1:
        raise ValueError(f"{what}: retained sample ids are {t.dtype} {list(t.shape)}, expected int64 [k]")
    ids = np.sort(t.numpy().astype(np.int64))
    if ids.size and ids[0] < 0:
        raise ValueError(f"{what}: negative retained sample id {int(ids[0])}")
    got = samples_sha256(ids)
    if want_sha is not None and got != want_sha:
        raise ValueError(f"{what}: retained sample ids hash to {got}, the announced samples_sha256 is {want_sha}")
    return ids


def load_blobs(trainer: SiteTrainer, blobs: dict[str, dict[str, torch.Tensor]]) -> None:
    """Overwrite the trainer's model, inner AdamW and outer state with `blobs` (CPU tensors)."""
    model = blobs["model"]
    names = [n for n, _ in trainer.model.named_parameters()]
    missing = sorted(set(names) - set(model))
    if missing:
        raise ValueError(f"state lacks parameters {missing[:3]}{'...' if len(missing) > 3 else ''}")
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if tuple(model[n].shape) != tuple(p.shape):
                raise ValueError(f"parameter {n}: shape {tuple(model[n].shape)} != {tuple(p.shape)}")
            p.copy_(model[n])
    # Inner AdamW: per-parameter state keyed "<param name>.<state key>".
    inner = blobs.get("inner_optim", {})
    trainer.inner_opt.state.clear()
    for n, p in trainer.model.named_parameters():
        st = {key[len(n) + 1:]: t for key, t in inner.items() if key.startswith(n + ".")
              and "." not in key[len(n) + 1:]}
        if st:
            trainer.inner_opt.state[p] = {k: v.clone().to(p.device) if k != "step" else v.clone()
                                          for k, v in st.items()}
    outer = blobs.get("outer", {})
    if "global_params" in outer:
        with torch.no_grad():
            trainer.global_params.copy_(outer["global_params"])
    trainer.outer_opt.state.clear()
    if "momentum" in outer:
        trainer.outer_opt.state[trainer.global_params] = {"momentum_buffer": outer["momentum"].clone()}
    if trainer.cfg.train.mode == "local":
        # In local mode a round starts from the global parameters.
        load_flat_params_(trainer.model, trainer.global_params.detach())


def restore_snapshot(trainer: SiteTrainer, snap: Snapshot) -> None:
    load_blobs(trainer, snap.blobs)
    if trainer.params_hash() != snap.params_hash:
        raise RuntimeError(f"restored state of round {snap.round} does not match its hash")
