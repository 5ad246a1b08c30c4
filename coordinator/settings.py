"""The coordinator's side of consistency settings per epoch: which setting an epoch carries, when
a change is due, and the step count an epoch starts at.

Rules (the decisions are pure functions; `EpochSettings` only keeps what they need):
- Every epoch carries a setting, `start_step` (inner steps before its start round, accumulated
  round by round with each round's own H: ground.setting.steps_before) and `prev_mode` (the mode
  of the round before its start: a site entering sync from local resets its inner optimizer).
- A recovery epoch (failure, rejoin, restore, resync) carries the setting its start boundary has:
  fixed modes the run's; scripted the schedule's at that boundary (control.scripted.setting_at);
  adaptive the current one.
- A change is announced only when the cluster is otherwise quiet (no recovery decision, not
  paused, no epoch scheduled for a later boundary): a new epoch with the same members, resuming
  from their own snapshots (Restore.NONE) at the next round boundary (after the round in flight),
  so nothing in flight is thrown away. Scripted: when the next boundary's setting differs from
  the current one. Adaptive: when the controller's last decision (on the last committed round's
  observation, or, under controller v2, on the round in flight: `in_cycle`) is a change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.controller import Decision, decide
from control.progress_rate import decide_after_cycle, decide_in_cycle
from control.observations import Observation, SiteCycle, observe
from control.scripted import setting_at
from ground.setting import ConsistencySetting, base_setting, effective_config, steps_before
from ground.config import RunConfig


@dataclass(frozen=True)
class EpochSetting:
    start_round: int
    setting: ConsistencySetting
    start_step: int
    prev_mode: str

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting.to_json(), "start_step": self.start_step, "prev_mode": self.prev_mode}


def setting_for_epoch(cfg: RunConfig, current: ConsistencySetting, start_round: int,
                      start_cursor: int) -> ConsistencySetting:
    """The setting a recovery epoch starting at (start_round, start_cursor) carries."""
    if cfg.train.mode == "scripted":
        return setting_at(cfg, start_round, start_cursor)[0]
    if cfg.train.mode == "adaptive":
        return current
    return base_setting(cfg)


def due_change(cfg: RunConfig, current: ConsistencySetting, boundary: tuple[int, int],
               decision: Decision | None) -> tuple[ConsistencySetting, str] | None:
    """A change to announce for `boundary` (round, cursor), with the reason; None to keep."""
    if cfg.train.mode == "scripted":
        want, idx = setting_at(cfg, *boundary)
        if want != current:
            return want, (f"scripted: change {idx} ({want.label()}) from round {boundary[0]} "
                          f"(cursor {boundary[1]}); was {current.label()}")
    elif cfg.train.mode == "adaptive" and decision is not None and decision.action == "change" \
            and decision.setting != current:
        return decision.setting, f"adaptive: {decision.setting.label()} from round {boundary[0]}: {decision.reason}"
    return None


class EpochSettings:
    """The settings of the epochs announced so far, the commit record's step, and the controller's
    observations; rebuilt from the journal on a coordinator restart."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.epochs: dict[int, EpochSetting] = {}
        self.order: list[int] = []  # epochs in announcement order
        self.committed_step = 0
        self.steps_by_commit: dict[str, int] = {}
        self.observations: list[Observation] = []
        self.decision: Decision | None = None
        self.cycles: dict[tuple[int, int], dict[str, SiteCycle]] = {}  # (epoch, round) -> member -> cycle
        self._own_cycles: set[tuple[int, int]] = set()  # keys whose map this object may change in place
        # When the round in flight started (the last commit, or a recovery epoch's formation; ns on the
        # core's clock) and the round an in-cycle decision was last taken for (one per round).
        self.round_started_ns: int | None = None
        self.in_cycle_round = -1

    def copy(self) -> EpochSettings:
        """A working copy for one step of the pure core (coordinator/core.py): containers copied, their
        frozen elements shared."""
        c = EpochSettings(self.cfg)
        c.epochs, c.order = dict(self.epochs), list(self.order)
        c.committed_step, c.steps_by_commit = self.committed_step, dict(self.steps_by_commit)
        c.observations, c.decision = list(self.observations), self.decision
        c.cycles = dict(self.cycles)  # a round's map is copied when the copy first adds to it (on_cycle)
        c._last_members = self._last_members
        c._effective = self._effective
        c.round_started_ns, c.in_cycle_round = self.round_started_ns, self.in_cycle_round
        return c

    def _key(self) -> tuple[Any, ...]:
        return (self.epochs, self.order, self.committed_step, self.steps_by_commit, self.observations, self.decision,
                self.cycles, self._last_members, self.round_started_ns, self.in_cycle_round)

    def __eq__(self, other: object) -> bool:  # the core's states compare by value (its purity tests)
        return isinstance(other, EpochSettings) and self.cfg == other.cfg and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable: never a dict key

    @property
    def current(self) -> ConsistencySetting:
        return self.epochs[self.order[-1]].setting if self.order else base_setting(self.cfg)

    def effective(self) -> RunConfig:
        """The config the current epoch trains under (its round size, its mode); kept per setting
        (two dataclass copies at every tick's view otherwise)."""
        cur = self.current
        if self._effective is None or self._effective[0] != cur:
            self._effective = (cur, effective_config(self.cfg, cur))
        return self._effective[1]

    def of(self, epoch: int) -> EpochSetting | None:
        return self.epochs.get(epoch)

    # ------------------------------------------------------------------ lineage
    def on_commit(self, commit_id: str, step: int) -> None:
        self.committed_step = step
        self.steps_by_commit[commit_id] = step

    def on_store_restore(self, parent_commit: str | None) -> None:
        """A restore from the store: the lineage (and its step count) continues from the frontier's commit."""
        self.committed_step = self.steps_by_commit.get(parent_commit, 0) if parent_commit else 0

    # ------------------------------------------------------------------ epochs
    def plan_epoch(self, epoch: int, start_round: int, committed_round: int,
                   setting: ConsistencySetting) -> EpochSetting:
        """Record epoch `epoch` (starting at start_round, in `setting`); called after any store
        restore has reset the lineage. start_step accumulates every round since the commit record."""
        history = [(self.epochs[e].start_round, self.epochs[e].setting) for e in self.order]
        anchor = committed_round + 1
        if start_round < anchor:  # a rollback below the commit record (restore): anchored by on_store_restore
            anchor = start_round
        start_step = steps_before(anchor, self.committed_step, history, start_round) if start_round > anchor \
            else self.committed_step
        prev = [s for r, s in history if r <= start_round - 1]
        prev_mode = prev[-1].mode if prev and start_round > 0 else setting.mode
        es = EpochSetting(start_round, setting, start_step, prev_mode)
        self.epochs[epoch] = es
        self.order.append(epoch)
        if setting != (self.epochs[self.order[-2]].setting if len(self.order) > 1 else setting):
            self.decision = None  # a decision is about the setting it was made in
        return es

    def replay_epoch(self, epoch: int, setting: ConsistencySetting | None, start_step: int | None,
                     prev_mode: str | None, start_round: int) -> None:
        """An epoch record read back from the journal (ground/records.EpochRecord's setting fields)."""
        if setting is None or start_step is None or prev_mode is None:
            # A journal from before settings existed: the run's fixed setting.
            base = base_setting(self.cfg)
            es = EpochSetting(start_round, base, start_round * base.steps_per_round, base.mode)
        else:
            es = EpochSetting(start_round, setting, start_step, prev_mode)
        self.epochs[epoch] = es
        self.order.append(epoch)

    # ------------------------------------------------------------------ observations
    def on_cycle(self, epoch: int, rnd: int, site: str, cycle: dict[str, Any] | SiteCycle | None) -> None:
        """A member's cycle: a map from its report, or a SiteCycle its sender built (the simulator)."""
        if cycle is None:
            return
        if type(cycle) is SiteCycle:
            got = cycle
        else:
            try:
                got = SiteCycle.from_json(cycle)
            except ValueError:
                return  # a malformed measurement is no evidence; the commit does not depend on it
        self.cycles_of((epoch, rnd))[site] = got

    def cycles_of(self, key: tuple[int, int]) -> dict[str, SiteCycle]:
        """The members' cycles of (epoch, round), this object's own to add to (made if none)."""
        got = self.cycles.get(key)
        if got is None or key not in self._own_cycles:  # copy on write: a copy shares its maps
            got = self.cycles[key] = dict(got) if got is not None else {}
            self._own_cycles.add(key)
        return got

    def after_commit(self, epoch: int, rnd: int, members: tuple[str, ...],
                     now_ns: int = 0) -> tuple[Observation | None, Decision | None]:
        """The observation of a committed round and, in adaptive mode, the controller's decision."""
        self.round_started_ns = now_ns  # the next round is in flight from now
        cycles = self.cycles.pop((epoch, rnd), {})
        self.cycles = {k: v for k, v in self.cycles.items() if k[1] > rnd}
        if set(cycles) != set(members):
            return None, None
        es = self.epochs.get(epoch)
        setting = es.setting if es is not None else self.current
        obs = observe(rnd, epoch, setting.label(), setting.steps_per_round, cycles, self._last_members)
        self._last_members = tuple(sorted(cycles))
        self.observations = (self.observations + [obs])[-64:]
        if self.cfg.train.mode != "adaptive":
            return obs, None
        acfg = self.cfg.train.adaptive
        rule = decide_after_cycle if acfg.rule == "progress_rate" else decide
        self.decision = rule(self.observations, self.current, acfg)
        return obs, self.decision

    def on_recovery_epoch(self, now_ns: int) -> None:
        """A recovery epoch restarts the round in flight from now."""
        self.round_started_ns = now_ns

    def in_cycle(self, rnd: int, now_ns: int) -> Decision | None:
        """Controller v2's decision on round `rnd`, in flight since `round_started_ns` (at most one per
        round; None when the round is within its prediction or the rule is not v2)."""
        acfg = self.cfg.train.adaptive
        if self.cfg.train.mode != "adaptive" or acfg.rule != "progress_rate" or self.round_started_ns is None \
                or self.in_cycle_round >= rnd:
            return None
        d = decide_in_cycle(self.observations, self.current, now_ns - self.round_started_ns, acfg)
        if d is not None:
            self.in_cycle_round, self.decision = rnd, d
        return d

    _last_members: tuple[str, ...] | None = None
    _effective: tuple[ConsistencySetting, RunConfig] | None = None  # a cache: never compared
