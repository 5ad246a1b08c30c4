"""What the coordinator remembers of recent epochs, kept identically live and on journal replay.

A round in flight when a new epoch is scheduled is still reported in the epoch it was trained
in, sometimes after the next epoch (or two) started. The coordinator counts such a report only
for an epoch it remembers (`epoch_members`: the last `EPOCHS_KEPT` epochs' members), and its
WAN fence admits messages from the oldest of them. A coordinator restarted from its journal
must remember exactly what it remembered before the crash; otherwise it refuses the previous
epoch's in-flight reports, resyncs every member back past snapshots they no longer hold, and
the cluster churns (soak seed 1005 under `oracle`: a coordinator crash 0.9 s after a drain).

Pure functions: journal records in, state out. `coordinator.service` uses `remember_epoch` when
it forms an epoch and `recent_epochs` when it replays its journal, so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

EPOCHS_KEPT = 4  # epochs before the current one whose in-flight reports still count


def remember_epoch(recent: Mapping[int, tuple[str, ...]], prev_epoch: int, prev_members: Iterable[str],
                   new_epoch: int) -> dict[int, tuple[str, ...]]:
    """The recent epochs once `new_epoch` starts after `prev_epoch` (0: none before it)."""
    out = dict(recent)
    if prev_epoch > 0:
        out[prev_epoch] = tuple(prev_members)
    return {e: m for e, m in out.items() if e >= new_epoch - EPOCHS_KEPT}


def fence_floor(recent: Mapping[int, tuple[str, ...]], epoch: int) -> int:
    """The oldest epoch whose messages are still admitted: the oldest remembered one, else the current."""
    return min(recent) if recent else epoch


@dataclass(frozen=True)
class RecentEpochs:
    """The epoch state a journal proves: the current epoch, its members and the remembered ones."""

    epoch: int = 0
    members: tuple[str, ...] = ()
    epoch_members: dict[int, tuple[str, ...]] = field(default_factory=dict)
    checkpoint_first_epoch: int = -1  # the epoch whose plan asks the leader to checkpoint first

    @property
    def fence(self) -> int:
        return fence_floor(self.epoch_members, self.epoch)


def after_epoch(r: RecentEpochs, epoch: int, members: Iterable[str], checkpoint_first: bool) -> RecentEpochs:
    """The state once `epoch` (with `members`) is formed."""
    return RecentEpochs(epoch=epoch, members=tuple(members),
                        epoch_members=remember_epoch(r.epoch_members, r.epoch, r.members, epoch),
                        checkpoint_first_epoch=epoch if checkpoint_first else r.checkpoint_first_epoch)


def recent_epochs(records: Iterable[Mapping[str, Any]]) -> RecentEpochs:
    """Replay the `epoch` records of a journal (other records are ignored)."""
    r = RecentEpochs()
    for rec in records:
        if rec.get("type") == "epoch":
            plan = rec["plan"]
            # Journals written before `checkpoint_first` was recorded: a drain always asked for it.
            first = bool(rec.get("checkpoint_first", plan.get("drain") is not None))
            r = after_epoch(r, int(rec["epoch"]), plan["members"], first)
    return r


def pending_checkpoints(records: Iterable[Mapping[str, Any]]) -> dict[tuple[int, int], str]:
    """Durable checkpoints of rounds the commit record did not have when they were reported
    ((round, cursor) -> manifest hash), less those a later frontier record made obsolete."""
    pending: dict[tuple[int, int], str] = {}
    for rec in records:
        if rec.get("type") == "checkpoint_pending":
            pending[(int(rec["round"]), int(rec["cursor"]))] = str(rec["manifest_hash"])
        elif rec.get("type") == "frontier":
            pending = {k: v for k, v in pending.items() if k[0] > int(rec["round"])}
    return pending
