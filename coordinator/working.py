"""The coordinator core's working copy of its state for one step, and the outputs every rule appends
(an event, a rejected message, a new frontier). The rules that act on it are functions and
methods over this object (coordinator/rules.py, claims.py, commits.py): it imports none of them.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Any

from coordinator import membership
from coordinator.core_types import EVENTS, CoordState, Emit, Journal, Output, Received, membership_config, policy_of
from coordinator.recovery import Frontier
from coordinator.settings import EpochSettings
from ground.config import RunConfig
from ground.schedule import target_samples


class WorkingCopy:
    """A mutable working copy of one CoordState for one step: the rules (coordinator/rules.py, claims.py,
    commits.py) act on it, appending what the shell must do to `out`; `freeze` makes the new state."""

    def __init__(self, s: CoordState, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.policy = policy_of(cfg)
        self.mcfg = membership_config(cfg)
        self.target = target_samples(cfg)
        self.out: list[Output] = []
        self.membership, self.plan, self.recent, self.oracle = s.membership, s.plan, s.recent, s.oracle
        self.oracle_dropped, self.replanned = set(s.oracle_dropped), set(s.replanned)
        self.resync, self.checkpoint_first = s.resync, s.checkpoint_first
        self.commits = list(s.commits)
        self.tip, self.committed_round, self.committed_cursor = s.tip, s.committed_round, s.committed_cursor
        self.frontier, self.unproven, self.settle_until_ns = s.frontier, set(s.unproven), s.settle_until_ns
        self.pending_frontiers = dict(s.pending_frontiers)
        # Copy on write: the outer map is copied here, a round's reports only when this step adds one
        # (`own_reports`: the keys whose inner map is this working copy's own), so a step costs O(1)
        # in the number of members, not a copy of every report held (the simulator at 1,000 sites).
        self.reports = dict(s.reports)
        self.own_reports: set[tuple[int, int]] = set()
        self._own_sites: dict[str, membership.SiteRecord] | None = None  # see _sites_for_write
        self.claims, self.accusations = dict(s.claims), dict(s.accusations)
        self.last_reason, self.last_recovery_reason = s.last_reason, s.last_recovery_reason
        self.shutdown_sent = s.shutdown_sent
        self.settings = s.settings.copy() if s.settings is not None else EpochSettings(cfg)

    def freeze(self) -> CoordState:
        return CoordState(membership=self.membership, plan=self.plan, recent=self.recent, oracle=self.oracle,
                          oracle_dropped=frozenset(self.oracle_dropped), replanned=frozenset(self.replanned),
                          resync=self.resync, checkpoint_first=self.checkpoint_first, commits=tuple(self.commits),
                          tip=self.tip, committed_round=self.committed_round, committed_cursor=self.committed_cursor,
                          frontier=self.frontier, unproven=frozenset(self.unproven),
                          settle_until_ns=self.settle_until_ns, pending_frontiers=self.pending_frontiers,
                          reports=self.reports, claims=self.claims, accusations=self.accusations,
                          last_reason=self.last_reason,
                          last_recovery_reason=self.last_recovery_reason, shutdown_sent=self.shutdown_sent,
                          settings=self.settings)

    def emit(self, event: str, **fields: Any) -> None:
        assert event in EVENTS, event
        self.out.append(Emit(event, fields))

    @property
    def epoch_members(self) -> dict[int, tuple[str, ...]]:
        return self.recent.epoch_members

    def _sites_for_write(self) -> dict[str, membership.SiteRecord]:
        """The membership's site map, this working copy's own (copied once per step, then changed in
        place): the membership functions copy it for every change, O(N) per heartbeat at scale."""
        if self._own_sites is None or self._own_sites is not self.membership.sites:
            self._own_sites = dict(self.membership.sites)
            self.membership = replace(self.membership, sites=self._own_sites)
        return self._own_sites

    def reject(self, msg: Received, reason: str, **extra: Any) -> None:
        self.emit("report_rejected", kind=str(msg.kind)[:64], src=msg.src, site=msg.src, msg_epoch=msg.epoch,
                  reason=reason, **extra)

    def set_frontier(self, f: Frontier) -> None:
        self.frontier = f
        self.pending_frontiers = {k: v for k, v in self.pending_frontiers.items() if k[0] > f.round}
        self.out.append(Journal({"type": "frontier", **asdict(f)}))
        self.emit("frontier", **asdict(f))
