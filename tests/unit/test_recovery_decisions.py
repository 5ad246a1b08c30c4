"""Recovery policies as pure decisions on a fixed view: exact plans and reasons."""

from __future__ import annotations

from dataclasses import replace

from coordinator.recovery import (ClusterView, Drain, Frontier, Plan, Policy, Restore, checkpoint_before_waiting,
                                  decide_recovery)

BASE = ClusterView(expected=("a", "b", "c"), epoch=1, members=("a", "b", "c"), paused=False, failed=(),
                   joiners=(), committed_round=4, committed_cursor=480, frontier=Frontier(3, 384, "f" * 64, "e1r3"),
                   target_samples=1000, round_samples=96)
B_FAILED = replace(BASE, failed=("b",))


def test_elastic_survivors_continue_from_the_next_uncommitted_round():
    plan, why = decide_recovery(B_FAILED, Policy.ELASTIC)
    assert plan == Plan(("a", "c"), False, 5, 480, Restore.NONE)
    assert why == "elastic: ['b'] failed; ['a', 'c'] continue from round 5"


def test_stall_and_restart_survivors_wait():
    for policy in (Policy.STALL, Policy.RESTART):
        plan, _ = decide_recovery(B_FAILED, policy)
        assert plan == Plan(("a", "c"), True, 5, 480, Restore.NONE)


def test_restarted_site_rejoins_elastic_at_the_next_boundary_from_a_donor():
    v = replace(BASE, members=("a", "c"), joiners=("b",), round_samples=64)
    plan, why = decide_recovery(v, Policy.ELASTIC)
    # The round in flight (5) finishes under the old epoch; b joins from round 6.
    assert plan == Plan(("a", "b", "c"), False, 6, 544, Restore.DONOR, donor="a", joiners=("b",))
    assert "rejoin by state transfer from a at round 6" in why


def test_restart_rolls_everyone_back_to_the_frontier_when_all_are_back():
    v = replace(BASE, members=("a", "c"), paused=True, joiners=("b",), round_samples=0)
    plan, _ = decide_recovery(v, Policy.RESTART)
    assert plan == Plan(("a", "b", "c"), False, 4, 384, Restore.STORE, joiners=("b",), manifest_hash="f" * 64,
                        parent_commit="e1r3")


def test_stall_waits_until_every_site_is_back():
    v = replace(BASE, expected=("a", "b", "c", "d"), members=("a", "c"), paused=True, joiners=("b",))
    plan, why = decide_recovery(v, Policy.STALL)
    assert plan is None and why == "stall: waiting for ['d'] before resuming"


def test_lone_fresh_member_never_becomes_the_source_of_truth():
    # Nobody with committed state is left: the joiner must load the durable frontier.
    v = replace(BASE, members=(), joiners=("b",), failed=("a", "c"))
    plan, why = decide_recovery(v, Policy.ELASTIC)
    assert plan is not None and plan.restore == Restore.STORE and plan.manifest_hash == "f" * 64
    assert "no healthy donor" in why


def test_oracle_drops_the_victim_at_the_boundary_before_its_fault():
    v = replace(BASE, drop_before=(("b", 600),))
    plan, why = decide_recovery(v, Policy.ORACLE)
    assert plan == Plan(("a", "c"), False, 6, 576, Restore.NONE, drain=Drain("b", 600))
    assert why.startswith("oracle: b will fail at cursor 600")
    far = replace(BASE, drop_before=(("b", 900),))
    assert decide_recovery(far, Policy.ORACLE) == (None, "no change")


def test_oracle_drain_right_after_a_rejoin_gives_the_joiner_state_again():
    """Churn under oracle (make sim-validate): b rejoined by transfer from a at round 9 (epoch 3),
    and the oracle at once drained c "from round 9" (epoch 4) with restore none. b, its transfer cut
    short by epoch 4, held no state: `restore_failed: no snapshot of round 9`, then b was declared
    failed, a trained round 9 alone, and b rejoined at round 10. A member not yet in a commit since
    it got state is a joiner of the drain's plan too."""
    v = replace(BASE, drop_before=(("c", 600),), unproven=("b",), scheduled=(6, 576))
    plan, why = decide_recovery(v, Policy.ORACLE)
    assert plan == Plan(("a", "b"), False, 6, 576, Restore.DONOR, donor="a", joiners=("b",), drain=Drain("c", 600))
    assert why == ("oracle: c will fail at cursor 600; drained and dropped it from round 6; ['b'] hold no "
                   "proven state: state from a")
    # Nobody proven left besides the victim: no drain (the fault is met when it fires).
    alone = replace(v, members=("b", "c"))
    assert decide_recovery(alone, Policy.ORACLE) == (None, "no change")
    # The rejoin's epoch already began (b trains round 5 under it; nothing is scheduled): b keeps
    # its state into the drain's round 6, which begins after round 5 proves it.
    begun = replace(v, scheduled=None)
    assert decide_recovery(begun, Policy.ORACLE)[0] == Plan(("a", "b"), False, 6, 576, Restore.NONE,
                                                              drain=Drain("c", 600))


def test_oracle_does_not_drain_before_the_first_commit():
    # Soak schedule 1004: a's hang fired at the end of round 0; draining it "from round 1" before
    # anything committed let a slow-starting a skip round 0 altogether and stall b and c.
    early = replace(BASE, committed_round=-1, committed_cursor=0, drop_before=(("a", 96),))
    assert decide_recovery(early, Policy.ORACLE) == (None, "no change")
    after_first = replace(early, committed_round=0, committed_cursor=96, drop_before=(("a", 192),))
    plan, why = decide_recovery(after_first, Policy.ORACLE)
    assert plan is not None and "a" not in plan.members and why.startswith("oracle: a will fail"), (plan, why)


def test_preemption_checkpoints_first_only_under_restart():
    assert checkpoint_before_waiting(Policy.RESTART)[0] is True
    assert not any(checkpoint_before_waiting(p)[0] for p in (Policy.STALL, Policy.ELASTIC, Policy.ORACLE))


# A joiner whose state transfer a newer epoch cut short holds no state (soak seed 1001: a rejoined
# by transfer from b, b was restarted mid-transfer, and a was then named a continuing member and a
# donor; every epoch after that failed to restore and the run never finished).
A_JOINING_B_FAILED = replace(BASE, members=("a", "b", "c"), failed=("b",), unproven=("a",))


def test_a_failure_during_a_transfer_gives_the_unfinished_joiner_state_again():
    plan, why = decide_recovery(A_JOINING_B_FAILED, Policy.ELASTIC)
    assert plan == Plan(("a", "c"), False, 5, 480, Restore.DONOR, donor="c", joiners=("a",))
    assert why == ("elastic: ['b'] failed; ['a', 'c'] continue from round 5; ['a'] hold no proven state: "
                   "state from c")


def test_an_unproven_member_is_never_the_donor_of_a_rejoin():
    v = replace(BASE, members=("a", "c"), joiners=("b",), unproven=("a",), round_samples=64)
    plan, why = decide_recovery(v, Policy.ELASTIC)
    assert plan == Plan(("a", "b", "c"), False, 6, 544, Restore.DONOR, donor="c", joiners=("a", "b"))
    assert "state transfer from c" in why


def test_no_survivor_with_proven_state_rolls_back_to_the_store():
    v = replace(BASE, failed=("b",), unproven=("a", "c"))
    plan, why = decide_recovery(v, Policy.ELASTIC)
    assert plan == Plan(("a", "c"), False, 4, 384, Restore.STORE, manifest_hash="f" * 64, parent_commit="e1r3")
    assert "no survivor holds proven state" in why


def test_stall_hands_state_to_the_unproven_member_too_when_everyone_is_back():
    v = replace(BASE, members=("a", "c"), paused=True, joiners=("b",), unproven=("a",), round_samples=0)
    plan, _ = decide_recovery(v, Policy.STALL)
    assert plan == Plan(("a", "b", "c"), False, 5, 480, Restore.DONOR, donor="c", joiners=("a", "b"))
