"""Recovery policies as pure functions: (view of the cluster, policy) -> (plan or None, reason).

The coordinator builds a `ClusterView` from what it knows (members, sites confirmed failed,
restarted sites waiting to join, the last committed round and sample cursor, the durable
frontier) and asks `decide_recovery` whether a new membership epoch is needed. A `Plan` is
what every member of the new epoch is told: who is in, whether to train or to wait, which
round and sample cursor to resume from, and where a member's state comes from.

Policies (same failure, same target):
  stall    survivors pause until the failed site is back; it receives state from a donor
  restart  survivors pause; when everyone is back, all roll back to the durable frontier
           (loaded from the store) and redo the work since then
  elastic  survivors continue at once without the failed site; it rejoins later by peer
           state transfer at a round boundary
  oracle   knows the fault schedule: drops the victim at the round boundary just before its
           fault (so nothing in flight is lost) and has the continuing members' leader
           checkpoint the committed state there, then behaves like elastic; a yardstick

Invariant: a freshly started site is never the source of truth. State comes from a donor
that is a member of the current lineage, or from the durable frontier in the store.

What the oracle guarantees. It sees only site faults (crash, preemption, hang, restart)
triggered by useful tokens, i.e. by a cursor of the commit record (`drop_before`). For each
such fault it drains the victim once, at the round boundary after the round in flight, as soon
as the fault is less than two rounds ahead; the drain's plan names the fault (`Plan.drain`).
So no round the victim takes part in is in flight when the fault fires, and the fault costs no
work, provided that at that moment (1) a round has committed, (2) the victim is a member with
at least one other member, (3) the cluster is not paused, and (4) the boundary is before the
target. A fault drained for, or passed by the commit record, is spent (`OracleFaults`): a
rollback below its cursor never makes the oracle anticipate it again. Hence, on a schedule of
visible faults that meet (1)-(4), the oracle loses no work: never more than any policy on the
same schedule. Faults it cannot see (wall-time triggers, links, the store, the coordinator) or
cannot drain for are met as `elastic` meets them, and may cost work like any policy's.
(`tests/unit/test_oracle_guarantee.py` checks this on random multi-fault schedules.)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from ground.plans import Drain, Plan, Restore


class Policy(str, enum.Enum):
    STALL = "stall"
    RESTART = "restart"
    ELASTIC = "elastic"
    ORACLE = "oracle"


@dataclass(frozen=True)
class Frontier:
    round: int  # last round the checkpoint covers
    cursor: int  # sample positions [0, cursor) are in it
    manifest_hash: str
    commit_id: str | None


@dataclass(frozen=True)
class ClusterView:
    expected: tuple[str, ...]  # every site of the cluster
    epoch: int
    members: tuple[str, ...]
    paused: bool  # the current epoch is a pause: members wait
    failed: tuple[str, ...]  # confirmed failed (and not back yet); may include current members
    joiners: tuple[str, ...]  # (re)started sites that joined and wait for admission
    committed_round: int  # -1 before the first commit
    committed_cursor: int
    frontier: Frontier | None
    target_samples: int
    # oracle only: (site, cursor at which its fault fires) of every visible fault still ahead: not yet
    # drained for, and not yet passed by the commit record (a fault fires once, the first time the
    # commit record reaches its cursor; a later rollback below it does not make it fire again).
    drop_before: tuple[tuple[str, int], ...] = ()
    round_samples: int = 0  # samples of one round with the current members (0 when paused)
    # Members whose state came from elsewhere (a donor transfer or the store) and who have not yet
    # taken part in a commit since: they may hold no state at all (a transfer cut short by a newer
    # epoch), so they are never a donor nor a member that resumes from its own snapshot.
    unproven: tuple[str, ...] = ()
    # (round, cursor) where the current epoch takes effect when that is beyond the round in flight
    # (a rejoin or a drain scheduled for the next boundary, not begun yet); None otherwise.
    scheduled: tuple[int, int] | None = None
    # The members whose plain layout (ground.schedule.site_positions) the round in flight follows,
    # when that is known; empty otherwise (a paused epoch, a round already carried, several workers
    # per site). A failure's survivors then take that round over keeping their steps (Plan.carry).
    in_flight_layout: tuple[str, ...] = ()


@dataclass(frozen=True)
class OracleFaults:
    """The faults the oracle can see, and which of them are spent.

    A fault is spent once the oracle drained its victim for it, or once the commit record reached
    its cursor (it fired then, or would have: the chaos driver fires a progress trigger once).
    Neither is undone by a rollback, a restart from the store or a coordinator restart (the
    coordinator replays both from its journal), so each fault is anticipated at most once.
    """

    faults: tuple[tuple[str, int], ...] = ()  # (site, cursor at which its fault fires), scenario order
    drained: frozenset[int] = frozenset()  # indices into `faults` the oracle drained for
    passed_cursor: int = 0  # the highest cursor the commit record ever reached

    def ahead(self) -> tuple[tuple[str, int], ...]:
        """The faults still to come: what `ClusterView.drop_before` holds."""
        return tuple(f for i, f in enumerate(self.faults) if i not in self.drained and f[1] > self.passed_cursor)

    def after_commit(self, cursor_end: int) -> OracleFaults:
        return replace(self, passed_cursor=max(self.passed_cursor, cursor_end))

    def after_plan(self, plan: Plan) -> OracleFaults:
        """Mark the fault a plan drains for as spent (the first unspent one it names)."""
        if plan.drain is None:
            return self
        for i, f in enumerate(self.faults):
            if i not in self.drained and f == (plan.drain.site, plan.drain.at_cursor):
                return replace(self, drained=self.drained | {i})
        return self


def _resume(v: ClusterView) -> tuple[int, int]:
    return v.committed_round + 1, v.committed_cursor


def _at_next_boundary(v: ClusterView) -> tuple[int, int] | None:
    """Where a change that needs no abort takes effect: after the round now in flight.

    Healthy members run one round ahead of the commit record, so a membership change that is
    not forced by a failure (a rejoin, the oracle's drain) is scheduled for the round after
    that one: nothing in flight is thrown away. None when that round would be past the target.
    """
    if v.scheduled is not None:
        # The round in flight belongs to the previous epoch (its members, its sample count), and
        # the current epoch starts after it: a change now takes effect at that same boundary.
        # (Soak seed 1005: a rejoin planned right after a drain took the drained epoch's single
        # member's round size and started round 7 at 448 samples where round 6 ended at 480.)
        return None if v.scheduled[1] >= v.target_samples else v.scheduled
    if v.paused or not v.members or v.round_samples <= 0:
        return _resume(v)
    cursor = v.committed_cursor + v.round_samples
    if cursor >= v.target_samples:
        return None
    return v.committed_round + 2, cursor


def decide_recovery(v: ClusterView, policy: Policy) -> tuple[Plan | None, str]:
    """A new epoch's plan, or None to keep the current one; always with the reason (the view only: no clock)."""
    if v.failed or v.unproven:
        lost = tuple(m for m in v.members if m in v.failed)
        survivors = tuple(m for m in v.members if m not in v.failed)
        proven = tuple(m for m in survivors if m not in v.unproven)  # hold the lineage's state for sure
        unproven = tuple(m for m in survivors if m in v.unproven)
    else:  # (the same split, without four passes over the members at every tick of a healthy run)
        lost, survivors, proven, unproven = (), v.members, v.members, ()
    start_round, start_cursor = _resume(v)

    # 1. A current member failed.
    if lost:
        if policy in (Policy.ELASTIC, Policy.ORACLE) and survivors:
            if not unproven:
                carry = v.in_flight_layout if set(survivors) < set(v.in_flight_layout) else ()
                return (Plan(survivors, False, start_round, start_cursor, Restore.NONE, carry=carry),
                        f"{policy.value}: {list(lost)} failed; {list(survivors)} continue from round {start_round}"
                        + ("; they keep the inner steps they took in it" if carry else ""))
            if proven and v.committed_round >= 0:
                # A survivor still joining (its transfer may have been cut short) gets state again.
                return (Plan(survivors, False, start_round, start_cursor, Restore.DONOR, donor=proven[0],
                             joiners=unproven),
                        f"{policy.value}: {list(lost)} failed; {list(survivors)} continue from round {start_round}; "
                        f"{list(unproven)} hold no proven state: state from {proven[0]}")
            return _from_store(v, survivors, policy, f"{list(lost)} failed and no survivor holds proven state")
        return (Plan(survivors, True, start_round, start_cursor, Restore.NONE),
                f"{policy.value}: {list(lost)} failed; {list(survivors)} wait")

    # 2. Oracle: drop a victim at the boundary before its fault fires.
    # Not before the first commit: until then a member may not even have adopted the first epoch
    # (a slow starter that sees the drain's epoch first would skip round 0 and stall the others;
    # seen in the soak, schedule 1004). A fault that early is met like elastic would meet it.
    if policy == Policy.ORACLE and not v.paused and v.committed_round >= 0:
        for site, at_cursor in v.drop_before:
            # Drop the victim at the boundary before the round in which its fault fires.
            if site in v.members and v.committed_cursor + 2 * v.round_samples > at_cursor and len(v.members) > 1:
                nxt = _at_next_boundary(v)
                if nxt is None:
                    continue
                rest = tuple(m for m in v.members if m != site)
                why = f"oracle: {site} will fail at cursor {at_cursor}; drained and dropped it from round {nxt[0]}"
                # Members still joining at this same boundary (the current epoch, a rejoin, has not
                # begun: their transfer is in flight, and this epoch cuts it short) get state again,
                # as case 1 gives it. With "restore none" they failed their restore, were dropped,
                # and rejoined a round later (churn under oracle). A joiner of an epoch already
                # begun trains its first round under it and is proven by that round's commit.
                # (No member failed here: `proven` and `unproven` split all of them.)
                pending = tuple(m for m in unproven if m != site) if nxt == v.scheduled else ()
                if not pending:
                    return Plan(rest, False, nxt[0], nxt[1], Restore.NONE, drain=Drain(site, at_cursor)), why
                held = [m for m in proven if m != site]
                if not held:
                    continue  # nobody left to give it state: the fault is met when it fires
                return (Plan(rest, False, nxt[0], nxt[1], Restore.DONOR, donor=held[0], joiners=pending,
                             drain=Drain(site, at_cursor)),
                        f"{why}; {list(pending)} hold no proven state: state from {held[0]}")

    # 3. Restarted sites want in (with them, members whose state is not proven get state again).
    if v.joiners:
        everyone_back = set(v.members) | set(v.joiners) >= set(v.expected)
        donor = proven[0] if proven and v.committed_round >= 0 else None
        v = replace(v, joiners=tuple(sorted(set(v.joiners) | set(unproven))))
        if policy in (Policy.ELASTIC, Policy.ORACLE):
            if v.committed_round < 0 and not v.members:
                return None, "no committed state yet and no members: wait for the first epoch"
            members = tuple(sorted(set(v.members) | set(v.joiners)))
            if donor is not None:
                nxt = _at_next_boundary(v)
                if nxt is None:
                    return None, f"{policy.value}: {list(v.joiners)} wait: the run ends with the round in flight"
                return (Plan(members, False, nxt[0], nxt[1], Restore.DONOR, donor=donor, joiners=v.joiners),
                        f"{policy.value}: {list(v.joiners)} rejoin by state transfer from {donor} at round {nxt[0]}")
            return _from_store(v, members, policy, "no healthy donor")
        if not everyone_back:
            missing = sorted(set(v.expected) - set(v.members) - set(v.joiners))
            return None, f"{policy.value}: waiting for {missing} before resuming"
        members = tuple(sorted(set(v.members) | set(v.joiners)))
        if policy == Policy.STALL:
            if donor is not None:
                return (Plan(members, False, start_round, start_cursor, Restore.DONOR, donor=donor, joiners=v.joiners),
                        f"stall: {list(v.joiners)} back; state from {donor}; resume at round {start_round}")
            return _from_store(v, members, policy, "no healthy donor")
        return _from_store(v, members, policy, "everyone is back")

    # 4. A pause with every expected site present (e.g. after a transient suspicion): resume.
    if v.paused and set(v.members) >= set(v.expected):
        return (Plan(v.members, False, start_round, start_cursor, Restore.NONE),
                f"{policy.value}: every site present; resume at round {start_round}")
    return None, "no change"


def _from_store(v: ClusterView, members: tuple[str, ...], policy: Policy, why: str) -> tuple[Plan | None, str]:
    if v.frontier is None:
        # Nothing durable yet: everyone starts over from the (deterministic) initial weights.
        return (Plan(members, False, 0, 0, Restore.STORE, joiners=v.joiners, manifest_hash=None, parent_commit=None),
                f"{policy.value}: {why}; no durable frontier yet, all restart from the initial weights")
    f = v.frontier
    return (Plan(members, False, f.round + 1, f.cursor, Restore.STORE, joiners=v.joiners,
                 manifest_hash=f.manifest_hash, parent_commit=f.commit_id),
            f"{policy.value}: {why}; all roll back to the durable frontier (round {f.round}, {f.cursor} samples)")


def checkpoint_before_waiting(policy: Policy) -> tuple[bool, str]:
    """On a preemption notice: should the survivors' leader write a checkpoint before they wait?"""
    if policy == Policy.RESTART:
        return True, "restart: a fresh durable frontier shortens the work redone after the rollback"
    if policy == Policy.STALL:
        return False, "stall: the survivors' state is kept in memory and handed to the site when it is back"
    if policy == Policy.ELASTIC:
        return False, "elastic: the survivors keep training; the site rejoins from a peer"
    return False, "oracle: already drained before the fault"
