"""Which epoch a site adopts next (site_core/epochs.py, pure logic): any sequence of epochs,
including ones announced back to back, is applied in order; a plan is skipped only when it
governs no round the site could train in, and the skip says why."""

from __future__ import annotations

from site_core.epochs import interrupts, next_plan
from ground.plans import EpochPlan, Restore
from site_agent.messages import Shutdown


def plan(epoch: int, members: str, start: int, *, paused: bool = False, restore: str = "none") -> EpochPlan:
    return EpochPlan(epoch=epoch, members=tuple(sorted(members)), paused=paused, start_round=start,
                     start_cursor=start * 10, restore=Restore(restore))


E1 = plan(1, "abc", 0)
DRAIN_B = plan(2, "ac", 2)  # the oracle drains b "from round 2"
DRAIN_C = plan(3, "a", 3)  # ...and, 90 ms later, c "from round 3"


def test_two_drains_back_to_back_the_survivor_adopts_them_in_order_round_by_round():
    # Site a, still finishing round 1 of epoch 1, holds both plans.
    pending = [DRAIN_C, DRAIN_B]
    assert not interrupts(pending, 1, 1)  # round 1 finishes under epoch 1
    assert interrupts(pending, 1, 2)  # round 2 is epoch 2's
    chosen, waiting, skipped = next_plan(pending, 1, "a", E1)
    assert chosen == DRAIN_B and waiting == [DRAIN_C] and skipped == []
    # Round 2 is trained in epoch 2 (with c); epoch 3 waits for round 3.
    assert not interrupts(waiting, 2, 2)
    assert interrupts(waiting, 2, 3)
    chosen, waiting, skipped = next_plan(waiting, 2, "a", DRAIN_B)
    assert chosen == DRAIN_C and waiting == [] and skipped == []


def test_the_drained_partner_trains_the_round_it_still_owes_then_leaves():
    chosen, waiting, _ = next_plan([DRAIN_B, DRAIN_C], 1, "c", E1)
    assert chosen == DRAIN_B and waiting == [DRAIN_C]  # c trains round 2 with a
    chosen, _, _ = next_plan(waiting, 2, "c", DRAIN_B)
    assert chosen == DRAIN_C and "c" not in chosen.members  # then learns it was dropped


def test_a_drained_site_skips_an_epoch_it_is_not_in_when_a_later_one_is_already_known():
    chosen, waiting, skipped = next_plan([DRAIN_B, DRAIN_C], 1, "b", E1)
    assert chosen == DRAIN_C and waiting == []
    assert [(p.epoch, why) for p, why in skipped] == [
        (2, "not a member of epoch 2, and epoch 3 is already announced")]


def test_an_epoch_whose_rounds_a_later_epoch_takes_over_is_skipped_with_why():
    failure = plan(3, "a", 2)  # c crashed: a continues alone from round 2, where epoch 2 would have started
    chosen, waiting, skipped = next_plan([DRAIN_B, failure], 1, "a", E1)
    assert chosen == failure and waiting == []
    assert skipped[0][0] == DRAIN_B
    assert skipped[0][1] == ("epoch 3 takes effect from round 2, no later than epoch 2's round 2: "
                             "no round is trained in epoch 2")
    rollback = plan(4, "ab", 1, restore="store")  # a later rollback supersedes both
    chosen, _, skipped = next_plan([DRAIN_B, DRAIN_C, rollback], 1, "a", E1)
    assert chosen == rollback and [p.epoch for p, _ in skipped] == [2, 3]


def test_a_paused_epoch_followed_by_a_resume_is_skipped():
    pause = plan(2, "ab", 3, paused=True)
    resume = plan(3, "abc", 4, restore="donor")
    chosen, _, skipped = next_plan([pause, resume], 1, "a", E1)
    assert chosen == resume and "epoch 2 is paused, and epoch 3 is already announced" in skipped[0][1]


def test_old_epochs_are_void_and_a_resent_current_plan_reaches_only_a_removed_site():
    assert next_plan([E1], 1, "a", E1) == (None, [], [])  # a member needs no reminder
    removed = plan(2, "ac", 1)
    assert next_plan([removed], 2, "b", removed)[0] == removed  # told again so that it rejoins
    assert next_plan([E1, plan(1, "abc", 0)], 2, "a", removed) == (None, [], [])


def test_the_same_epoch_received_twice_is_one_plan_and_shutdowns_never_interrupt_as_plans():
    chosen, waiting, skipped = next_plan([DRAIN_B, DRAIN_B, DRAIN_C], 1, "a", E1)
    assert chosen == DRAIN_B and waiting == [DRAIN_C] and skipped == []
    assert not interrupts([Shutdown(epoch=1, reason="x")], 1, 0)  # the caller checks shutdowns itself
    assert interrupts([DRAIN_B], 1, None)  # between rounds, any newer epoch takes over
