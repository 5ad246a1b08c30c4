"""Snapshots of a site's training state, and loading state that came from elsewhere.

A snapshot is taken at the start of every round (the state after the previous round), so when
a new membership epoch says "resume at round r" a site rolls back to exactly that state: the
work of an aborted round is discarded, never half-applied. The same blob layout
(`model`, `inner_optim`, `outer` tensor dicts, as `SiteTrainer.state_tensors` writes it) serves
checkpoints in the store and peer state transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from site_agent.model import load_flat_params_
from site_agent.trainer import SiteTrainer


@dataclass(frozen=True)
class Snapshot:
    round: int  # the state at the start of this round
    blobs: dict[str, dict[str, torch.Tensor]]
    params_hash: str


def take_snapshot(trainer: SiteTrainer, rnd: int) -> Snapshot:
    blobs = {g: {k: v.clone() for k, v in d.items()} for g, d in trainer.state_tensors().items()}
    return Snapshot(rnd, blobs, trainer.params_hash())


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
