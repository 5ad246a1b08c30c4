"""Which membership epoch a site adopts next, from the plans it has received: pure logic.

An epoch's plan takes effect at its `start_round`; the epoch before it governs every round
before that. So epochs announced back to back ("b leaves from round 2", then "c leaves from
round 3") are applied in order: round 2 is trained in the first, round 3 in the second. A plan
is skipped only when it governs no round this site can train in:

- a later plan takes effect no later than it (`start_round` <= its own): it never governs a round;
- this site is not one of its members, or it is paused, and a later plan is already waiting.

Everything else stays waiting until the round it starts at comes up (`interrupts`).
"""

from __future__ import annotations

from typing import Sequence

from ground.plans import EpochPlan


def interrupts(pending: Sequence[object], epoch: int, inflight: int | None) -> bool:
    """True when a plan newer than `epoch` takes effect by the round in flight (None: between rounds)."""
    return any(isinstance(p, EpochPlan) and p.epoch > epoch and (inflight is None or p.start_round <= inflight)
               for p in pending)


def not_for_this_process(plan: EpochPlan, me: str, inc: int) -> str | None:
    """Why `plan` was made for another process of this site (None: it is for this one, or names none).

    A plan names the incarnation of each member it was made for. One naming a previous
    incarnation of this site (a recovered coordinator re-announcing its epoch, a message parked
    while the site was down) is not for this process: it holds none of that epoch's state and has
    asked to join, and the epoch that admits it names this incarnation (soak seed 1008, where a
    restarted site trained a round the cluster had already committed).
    """
    named = plan.incarnation_of(me)
    if named is None or named == inc:
        return None
    return f"epoch {plan.epoch} was made for incarnation {named} of {me}, not this process ({inc})"


def _superseded(p: EpochPlan, later: Sequence[EpochPlan], me: str) -> str | None:
    """Why plan p governs no round this site could train in, given the plans after it; None if it does."""
    first = next((q for q in later if q.start_round <= p.start_round), None)
    if first is not None:
        return (f"epoch {first.epoch} takes effect from round {first.start_round}, no later than epoch {p.epoch}'s "
                f"round {p.start_round}: no round is trained in epoch {p.epoch}")
    if me not in p.members:
        return f"not a member of epoch {p.epoch}, and epoch {later[-1].epoch} is already announced"
    if p.paused:
        return f"epoch {p.epoch} is paused, and epoch {later[-1].epoch} is already announced"
    return None


def next_plan(pending: Sequence[EpochPlan], epoch: int, me: str,
              current: EpochPlan | None) -> tuple[EpochPlan | None, list[EpochPlan], list[tuple[EpochPlan, str]]]:
    """The plan to adopt now, the plans that stay waiting, and the plans skipped (with why).

    Plans of epochs at or below `epoch` are void, except the current epoch's plan sent again
    to a site that is not one of its members (it is told again so that it asks to rejoin).
    """
    newer: dict[int, EpochPlan] = {}
    for p in pending:
        if p.epoch > epoch:
            newer[p.epoch] = p  # the same epoch sent twice: one plan
    chain = [newer[e] for e in sorted(newer)]
    if not chain:
        again = [p for p in pending if p.epoch == epoch]
        if again and (current is None or me not in current.members):
            return again[-1], [], []
        return None, [], []
    skipped: list[tuple[EpochPlan, str]] = []
    for i, p in enumerate(chain[:-1]):
        why = _superseded(p, chain[i + 1:], me)
        if why is None:
            return p, chain[i + 1:], skipped
        skipped.append((p, why))
    return chain[-1], [], skipped
