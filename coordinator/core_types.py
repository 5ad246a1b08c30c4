"""The coordinator core's values: its inputs, its outputs, its state (coordinator/core.py drives them).

Inputs: `Received` (a site's message: header fields and raw body), `Messages` (many sites' messages of
one kind at one instant, the same as one Received each) and `Tick` (one pass of the loop).
Outputs, in the order the shell carries them out: `Journal`, `Emit`, `Send`, `Fence`, `Context`.
`EVENTS` names every event the core emits: the decisions a replay compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from coordinator import membership
from coordinator.recovery import Frontier, OracleFaults, Policy
from coordinator.replay import RecentEpochs
from coordinator.settings import EpochSettings
from ground.config import RunConfig
from ground.messages import RoundDone
from ground.plans import Plan
from ground.values import builder
from ground.records import Commit

EVENTS = frozenset({
    "claim_pending", "claim_refuted", "commit", "commit_refused", "coordinator_recovered", "frontier", "frontier_deferred", "join_deferred",
    "journal_torn_tail", "membership_decision", "membership_epoch", "preemption_notice", "recovery_decision",
    "recovery_settled", "rejoin_answered", "report_rejected", "run_complete", "site_done", "site_failed",
    "site_joined", "site_metrics", "site_suspected", "suspicion_cleared",
    # consistency settings per epoch and the adaptive controller (coordinator/settings.py)
    "cycle_observed", "controller_decision", "setting_changed"})
KINDS = ("join", "heartbeat", "round_done", "site_done", "telemetry", "preempt_notice", "checkpoint_durable",
         "peer_unreachable")


# ------------------------------------------------------------------------------------ inputs
@dataclass(frozen=True)
class Received:
    """A message from a site: the WAN header's fields (already checked by wan/frames) and its raw body."""

    src: str
    inc: int
    epoch: int
    kind: str
    body: Any


# Received(...) with every field given, without the frozen __init__ (ground/values.py): the shell and
# the rules make one per message, a million an hour at 1,000 simulated sites.
RECEIVED = builder(Received)


@dataclass(frozen=True)
class Messages:
    """Messages of one kind at one instant, in arrival order, each (src, inc, epoch, kind, body): Received's
    fields. The same input as one `Received` each, in that order (`Rules.messages`; tests/test_coordinator_
    core.py compares the two). The simulator's unlogged runs send it: a thousand heartbeats or round
    reports an instant at 1,000 sites, each otherwise a Received, a parse and a dispatch. A logged input
    is always a Received (the input log and its replay know no other kind of message)."""

    kind: str  # what the messages are (each is still checked: one of another kind goes through `handle`)
    messages: tuple[tuple[str, int, int, str, Any], ...]


@dataclass(frozen=True)
class Tick:
    """One pass of the loop: `lost` = site -> when its connection closed with nothing heard since."""

    lost: tuple[tuple[str, int], ...] = ()


# ----------------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class Journal:
    record: dict[str, Any]


@dataclass(frozen=True)
class Emit:
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Send:
    to: str
    kind: str
    body: dict[str, Any]
    epoch: int


@dataclass(frozen=True)
class Fence:
    epoch: int


@dataclass(frozen=True)
class Context:
    fields: dict[str, Any]


Output = Journal | Emit | Send | Fence | Context


# ------------------------------------------------------------------------------------- state
@dataclass(frozen=True)
class CoordState:
    membership: membership.Membership = field(default_factory=membership.Membership)
    plan: Plan | None = None
    # The recent epochs (for reports of rounds in flight) and the epoch whose leader checkpoints first.
    recent: RecentEpochs = field(default_factory=RecentEpochs)
    # The faults the oracle sees, and which are spent (drained for, or passed): each fires once.
    oracle: OracleFaults = field(default_factory=lambda: OracleFaults(()))
    oracle_dropped: frozenset[tuple[str, int]] = frozenset()  # (site, incarnation) drained ahead of its fault
    replanned: frozenset[tuple[str, int, int]] = frozenset()  # (site, incarnation, epoch) re-sent its plan
    resync: bool = False
    checkpoint_first: bool = False  # the next pause asks the leader to checkpoint first (preemption)
    commits: tuple[Commit, ...] = ()
    tip: str | None = None  # the newest commit of the current lineage
    committed_round: int = -1
    committed_cursor: int = 0  # sample positions
    frontier: Frontier | None = None
    # Sites given state from a donor or the store and not yet in a commit since (ClusterView.unproven).
    unproven: frozenset[str] = frozenset()
    # After a restart from the journal: no new epoch until the members have had time to resend the
    # round reports they sent while the coordinator was down (monotonic ns; 0 = not settling).
    settle_until_ns: int = 0
    # Durable checkpoints of rounds not committed yet: (round, cursor) -> manifest hash.
    pending_frontiers: Mapping[tuple[int, int], str] = field(default_factory=dict)
    reports: Mapping[tuple[int, int], Mapping[str, RoundDone]] = field(default_factory=dict)
    # One member's word that another is unreachable, not acted on yet: (reporter, accused) -> (epoch,
    # when it came, ns). And how many of each member's claims failed someone (coordinator/claims.py).
    claims: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    accusations: Mapping[str, int] = field(default_factory=dict)
    last_reason: str = ""
    last_recovery_reason: str = ""
    shutdown_sent: bool = False
    # Consistency settings per epoch, the commit record's step count and the controller's evidence
    # (coordinator/settings.py); None only before initial_state gives it one. Rules works on a copy.
    settings: EpochSettings | None = None


def policy_of(cfg: RunConfig) -> Policy:
    return Policy(cfg.recovery.policy)


def membership_config(cfg: RunConfig) -> membership.MembershipConfig:
    return membership.MembershipConfig(expected_sites=tuple(cfg.cluster.sites), heartbeat_timeout_ms=cfg.wan.heartbeat_timeout_ms,
                               failure_confirm_ms=cfg.recovery.failure_confirm_ms,
                               disconnect_grace_ms=cfg.recovery.disconnect_grace_ms)
