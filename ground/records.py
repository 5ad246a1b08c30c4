"""The coordinator's durable records, typed: a commit of the lineage and a membership epoch.

Both are journaled by the coordinator (ground/journal.py, one JSON object per line, `type` first)
and read back on its restart; the commit is also its `commit` log event, which the analysis reads.
`to_json` is the journal line, `from_json` reads one back (a journal of an older version too).
The epoch carries the typed recovery plan (ground/plans.py): a new per-epoch setting is a field of
the plan or of this record, with a default, so an old journal still reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ground.plans import Plan
from ground.setting import ConsistencySetting


@dataclass(frozen=True)
class Commit:
    """Round `round` committed in `epoch`: every member reported the same parameter hash and the
    samples [cursor_start, cursor_end) continue the record; `parent` is the commit it descends from."""

    commit_id: str
    parent: str | None
    round: int
    step: int
    epoch: int
    members: tuple[str, ...]
    param_hash: str
    cursor_start: int  # sample positions
    cursor_end: int
    tokens: Mapping[str, int]  # per member: tokens it trained on in the round
    flops: Mapping[str, float]  # per member
    useful_tokens: int  # cursor_end in tokens: the lineage's useful tokens so far
    setting: ConsistencySetting | None = None  # the epoch's consistency setting (None: a journal from before them)

    def to_json(self) -> dict[str, Any]:
        d = {"type": "commit", "commit_id": self.commit_id, "parent": self.parent, "round": self.round,
             "step": self.step, "epoch": self.epoch, "members": list(self.members), "param_hash": self.param_hash,
             "cursor_start": self.cursor_start, "cursor_end": self.cursor_end, "tokens": dict(self.tokens),
             "flops": dict(self.flops), "useful_tokens": self.useful_tokens}
        if self.setting is not None:
            d["setting"] = self.setting.to_json()
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Commit:
        return Commit(commit_id=d["commit_id"], parent=d.get("parent"), round=int(d["round"]), step=int(d["step"]),
                      epoch=int(d["epoch"]), members=tuple(d["members"]), param_hash=d["param_hash"],
                      cursor_start=int(d["cursor_start"]), cursor_end=int(d["cursor_end"]),
                      tokens=dict(d.get("tokens", {})), flops=dict(d.get("flops", {})),
                      useful_tokens=int(d.get("useful_tokens", 0)),
                      setting=ConsistencySetting.from_json(d["setting"]) if d.get("setting") is not None else None)


@dataclass(frozen=True)
class EpochRecord:
    """Membership epoch `epoch` as journaled before anyone hears of it: its plan and why."""

    epoch: int
    plan: Plan
    reason: str
    held_out: tuple[tuple[str, int], ...] = ()  # (site, incarnation) kept out until a new incarnation joins
    checkpoint_first: bool = False  # the plan asks the leader to checkpoint the committed state first
    # The epoch's consistency setting, inner steps before its start round, the mode of the round
    # before it (coordinator/settings.py); None in a journal from before settings existed.
    setting: ConsistencySetting | None = None
    start_step: int | None = None
    prev_mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        d = {"type": "epoch", "epoch": self.epoch, "plan": self.plan.to_json(), "reason": self.reason,
             "held_out": [list(h) for h in self.held_out], "checkpoint_first": self.checkpoint_first}
        if self.setting is not None:
            d.update(setting=self.setting.to_json(), start_step=self.start_step, prev_mode=self.prev_mode)
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EpochRecord:
        return EpochRecord(epoch=int(d["epoch"]), plan=Plan.from_json(d["plan"]), reason=str(d.get("reason", "")),
                           held_out=tuple((str(s), int(i)) for s, i in d.get("held_out", [])),
                           checkpoint_first=bool(d.get("checkpoint_first", False)),
                           setting=ConsistencySetting.from_json(d["setting"]) if d.get("setting") is not None else None,
                           start_step=None if d.get("start_step") is None else int(d["start_step"]),
                           prev_mode=None if d.get("prev_mode") is None else str(d["prev_mode"]))
