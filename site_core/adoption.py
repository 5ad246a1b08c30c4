"""What adopting a membership epoch's plan means for one site: pure decisions, each with its reason.

The site agent (site_agent/adoption.py) and the simulated site (sim/site.py) both call these and
then carry the decision out, the agent with its trainer, the WAN and the store, the simulator on
its virtual clock. The decision tree (not a member, paused, from the store, from a donor, keep the
own state by carrying the round in flight over or rolling back to a snapshot) lives only here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from ground.plans import EpochPlan, Restore


class Adopt(Enum):
    REJOIN = "rejoin"  # not a member of the epoch, but alive: ask the coordinator to come back in
    PAUSE = "pause"  # the coordinator waits for failed sites: train nothing
    STORE = "store"  # load the durable checkpoint the plan names (none named: the initial weights)
    RECEIVE = "receive"  # a joiner: take the donor's state
    OWN = "own"  # keep the own state: carry the round in flight over, or roll back to the own snapshot


@dataclass(frozen=True)
class Adoption:
    """What to do with a plan. `keep_snapshots_through`: snapshots of later rounds belong to a lineage
    the cluster will not continue and are dropped before anything else, even if the restore fails
    (soak seed 1008). `checkpoint_first`: make the state at the start of the plan's first round durable
    (round start_round - 1 at start_cursor) before training (PAUSE: after rolling back to it)."""

    action: Adopt
    reason: str
    keep_snapshots_through: int
    leader: bool = False
    try_carry: bool = False  # OWN: try to carry the round in flight over before rolling back
    send_to: tuple[str, ...] = ()  # OWN: this site is the donor; send its state to these joiners
    checkpoint_first: bool = False


def decide_adoption(me: str, plan: EpochPlan) -> Adoption:
    """How site `me` adopts `plan` (already chosen by site_core.epochs.next_plan)."""
    start, members = plan.start_round, plan.members
    keep = start
    if me not in members:
        return Adoption(Adopt.REJOIN, f"not a member of epoch {plan.epoch} (members {list(members)})", keep)
    leader = members[0] == me
    first = plan.checkpoint_first and leader and start > 0
    if plan.paused:
        return Adoption(Adopt.PAUSE, "the coordinator is waiting for failed sites", keep, leader, checkpoint_first=first)
    if plan.restore == Restore.STORE:
        why = f"restore checkpoint {plan.manifest_hash}" if plan.manifest_hash is not None \
            else "nothing durable yet: every member restarts from the initial weights"
        return Adoption(Adopt.STORE, why, keep, leader, checkpoint_first=first)
    if plan.restore == Restore.DONOR and me in plan.joiners:
        return Adoption(Adopt.RECEIVE, f"a joiner: state from donor {plan.donor}", keep, leader, checkpoint_first=first)
    send_to = tuple(plan.joiners) if plan.restore == Restore.DONOR and plan.donor == me else ()
    why = f"own state at round {start}" + (f", then the donor of {list(send_to)}" if send_to else "")
    return Adoption(Adopt.OWN, why, keep, leader, try_carry=bool(plan.carry) and plan.restore == Restore.NONE,
                    send_to=send_to, checkpoint_first=first)


class Rollback(Enum):
    HELD = "held"  # the site already holds the state at the start of the round
    SNAPSHOT = "snapshot"  # restore the own snapshot of the round's start
    MISSING = "missing"  # no way to that state: the restore fails (the site rejoins)


def decide_rollback(next_round: int | None, start: int, snapshot_rounds: Iterable[int], epoch: int) -> tuple[Rollback, str]:
    """How a site whose next round is `next_round` (None: mid-round) comes to hold the state at the
    start of round `start`; MISSING's reason is the restore's error."""
    if next_round == start:
        return Rollback.HELD, f"holding the state at the start of round {start}"
    rounds = sorted(snapshot_rounds)
    if start in rounds:
        return Rollback.SNAPSHOT, f"own snapshot of round {start}"
    if next_round is not None and start > next_round:
        return Rollback.MISSING, (
            f"epoch {epoch} resumes at round {start}, but this site holds the state at the start of round "
            f"{next_round} and no epoch it received covers rounds {next_round}..{start - 1} (snapshots {rounds})")
    held = "mid-round" if next_round is None else f"round {next_round}"
    return Rollback.MISSING, f"no snapshot of round {start} (holding {held}, snapshots {rounds})"


def may_carry(plan: EpochPlan, next_round: int | None, progress: tuple[int, int, str, int] | None,
              mode: str, steps_h: int) -> tuple[bool, str]:
    """Whether the inner steps already taken in the round in flight may be kept in `plan`'s first round
    (which steps are kept is ground.schedule.steps_to_keep's). `progress`: (round, cursor, mode, H) of the
    round in flight; `mode`, `steps_h`: the plan's setting. The round must be the one the plan takes
    over, from the same cursor, in local mode with the same H, and the site must be mid-round."""
    if not plan.carry or plan.restore != Restore.NONE:
        return False, "the plan carries nothing over"
    if progress is None or next_round is not None:
        return False, "no round in flight"
    rnd, cursor, was, h = progress
    if (rnd, cursor) != (plan.start_round, plan.start_cursor):
        return False, f"the round in flight ({rnd} from {cursor}) is not the plan's ({plan.start_round} from " \
                      f"{plan.start_cursor})"
    if mode != "local" or was != "local" or h != steps_h:
        return False, f"the plan's setting ({mode}, H={steps_h}) is not the round's ({was}, H={h})"
    return True, f"round {rnd} taken over from cursor {cursor}"
