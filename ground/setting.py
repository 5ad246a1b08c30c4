"""A consistency setting, carried by every membership epoch, and the arithmetic that depends on it.

A setting is (mode sync | local, inner steps H, compression none | fp16 | int8). It is a property
of an epoch, like its members: it governs every round from the epoch's `start_round` until the
next epoch's. A change therefore takes effect at a round boundary, as a new epoch.

Exactness across changes. Every quantity that used to be `(round + 1) * steps_per_round` is
accumulated round by round instead: an epoch's plan carries `start_step`, the number of inner
steps the cluster took before its start round, and a round r of that epoch ends at step
`start_step + (r - start_round + 1) * steps_per_round(setting)` (`step_after_round`). Sample
cursors were already epoch-relative (ground.schedule.round_span from the plan's start
cursor), so useful tokens and the `at_useful_tokens` chaos triggers stay exact as they were;
`at_step` triggers read the commit record's steps, which this makes exact.

`effective_config(cfg, setting)` is the RunConfig an epoch trains under: the run's config with
train.mode / inner_steps_h / compression replaced by the setting, so every existing schedule
function (round_span, site_positions, samples_per_round) works per epoch unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from ground.config import RunConfig

MODES = ("sync", "local")
COMPRESSIONS = ("none", "fp16", "int8")
MAX_H = 4096


class SettingError(ValueError):
    """A setting (from a config or a message body) that does not fit; the message says why."""


@dataclass(frozen=True)
class ConsistencySetting:
    mode: Literal["sync", "local"] = "local"
    inner_steps_h: int = 8  # inner steps per round in local mode; a sync round is one step
    compression: Literal["none", "fp16", "int8"] = "none"  # the collective payload's encoding

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SettingError(f"mode {self.mode!r} is not one of {list(MODES)}")
        if self.compression not in COMPRESSIONS:
            raise SettingError(f"compression {self.compression!r} is not one of {list(COMPRESSIONS)}")
        if isinstance(self.inner_steps_h, bool) or not isinstance(self.inner_steps_h, int) \
                or not 1 <= self.inner_steps_h <= MAX_H:
            raise SettingError(f"inner_steps_h {self.inner_steps_h!r} is not an integer in [1, {MAX_H}]")
        if self.mode == "sync" and self.inner_steps_h != 1:
            object.__setattr__(self, "inner_steps_h", 1)  # a sync round is one step: one canonical form

    @property
    def steps_per_round(self) -> int:
        return 1 if self.mode == "sync" else self.inner_steps_h

    def label(self) -> str:
        """Short human form: 'sync', 'local H=4', 'local H=16 int8'."""
        s = "sync" if self.mode == "sync" else f"local H={self.inner_steps_h}"
        return s if self.compression == "none" else f"{s} {self.compression}"

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "inner_steps_h": self.inner_steps_h, "compression": self.compression}

    @staticmethod
    def from_label(text: str) -> ConsistencySetting:
        """Inverse of label(): 'sync', 'local H=4', 'local H=16 int8' (an observation names its setting so)."""
        parts = text.split()
        comp = parts.pop() if len(parts) > 1 and parts[-1] in COMPRESSIONS else "none"
        if parts == ["sync"]:
            return ConsistencySetting("sync", 1, comp)
        if len(parts) == 2 and parts[0] == "local" and parts[1].startswith("H=") and parts[1][2:].isdigit():
            return ConsistencySetting("local", int(parts[1][2:]), comp)
        raise SettingError(f"{text!r} is not a setting's label ('sync', 'local H=4', 'local H=16 int8')")

    @staticmethod
    def from_json(d: Any) -> ConsistencySetting:
        """Inverse of to_json; SettingError on anything that does not fit (never another exception)."""
        if not isinstance(d, dict) or set(d) - {"mode", "inner_steps_h", "compression"}:
            raise SettingError(f"a setting is a mapping of mode, inner_steps_h, compression; got {str(d)[:120]}")
        try:
            return ConsistencySetting(mode=d.get("mode", "local"), inner_steps_h=d.get("inner_steps_h", 8),
                                      compression=d.get("compression", "none"))
        except TypeError as e:  # an unhashable value compared with the allowed ones
            raise SettingError(str(e)) from None


def base_setting(cfg: RunConfig) -> ConsistencySetting:
    """The run's setting before any change: the configured mode (scripted / adaptive start in local),
    train.inner_steps_h and train.compression."""
    t = cfg.train
    return ConsistencySetting("sync" if t.mode == "sync" else "local", t.inner_steps_h, t.compression)


def effective_config(cfg: RunConfig, s: ConsistencySetting) -> RunConfig:
    """The run's config as one epoch trains under it (mode, H and compression from the setting)."""
    train = dataclasses.replace(cfg.train, mode=s.mode, inner_steps_h=s.inner_steps_h, compression=s.compression)
    return dataclasses.replace(cfg, train=train)


def is_fixed(cfg: RunConfig) -> bool:
    """True when the setting never changes during the run (train.mode sync or local)."""
    return cfg.train.mode in MODES


def step_after_round(start_step: int, start_round: int, rnd: int, s: ConsistencySetting) -> int:
    """Inner steps the cluster has taken once round `rnd` of an epoch (starting at `start_round`
    after `start_step` steps, in setting s) is done."""
    if rnd < start_round:
        raise ValueError(f"round {rnd} is before its epoch's start round {start_round}")
    return start_step + (rnd - start_round + 1) * s.steps_per_round


def steps_before(anchor_round: int, anchor_step: int, epochs: Iterable[tuple[int, ConsistencySetting]],
                 rnd: int) -> int:
    """Inner steps taken before round `rnd`, accumulating each round's own H.

    anchor: `anchor_step` steps were taken before round `anchor_round` (e.g. the commit record:
    committed_round + 1 and the last commit's step). `epochs`: (start_round, setting) of the
    epochs in announcement order; a round is governed by the LAST epoch announced whose start
    round is <= it (a later epoch replans the rounds from its start on, e.g. after a rollback).
    """
    eps = list(epochs)
    total = anchor_step
    for r in range(anchor_round, rnd):
        gov = [s for start, s in eps if start <= r]
        if not gov:
            raise ValueError(f"no epoch governs round {r}")
        total += gov[-1].steps_per_round
    return total
