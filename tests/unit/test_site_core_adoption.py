"""What adopting a plan means for one site (site_core/adoption.py, pure logic): the decision the site
agent and the simulated site both carry out, each branch with its reason."""

from __future__ import annotations

from ground.plans import EpochPlan, Restore
from site_core.adoption import Adopt, Adoption, Rollback, decide_adoption, decide_rollback, may_carry


def plan(members: str = "abc", start: int = 3, **kw) -> EpochPlan:
    return EpochPlan(**{"epoch": 4, "members": tuple(members), "paused": False, "start_round": start,
                        "start_cursor": start * 96, "restore": Restore.NONE, **kw})


def test_a_site_left_out_of_the_epoch_asks_to_rejoin_and_drops_snapshots_past_the_start():
    assert decide_adoption("b", plan("ac")) == Adoption(Adopt.REJOIN, "not a member of epoch 4 (members ['a', 'c'])", 3)


def test_a_paused_epoch_trains_nothing_and_only_its_leader_checkpoints_first():
    p = plan(paused=True, checkpoint_first=True)
    assert decide_adoption("a", p) == Adoption(Adopt.PAUSE, "the coordinator is waiting for failed sites", 3,
                                               leader=True, checkpoint_first=True)
    assert decide_adoption("b", p).checkpoint_first is False
    assert decide_adoption("a", plan(start=0, paused=True, checkpoint_first=True)).checkpoint_first is False


def test_a_store_restore_names_the_checkpoint_or_the_initial_weights():
    d = decide_adoption("b", plan(restore=Restore.STORE, manifest_hash="ab" * 32))
    assert (d.action, d.reason, d.leader) == (Adopt.STORE, f"restore checkpoint {'ab' * 32}", False)
    d = decide_adoption("a", plan(restore=Restore.STORE))
    assert (d.action, d.reason) == (Adopt.STORE, "nothing durable yet: every member restarts from the initial weights")


def test_a_donor_restore_the_joiner_receives_the_donor_sends_and_the_rest_keep_their_state():
    p = plan(restore=Restore.DONOR, donor="a", joiners=("c",))
    assert decide_adoption("c", p) == Adoption(Adopt.RECEIVE, "a joiner: state from donor a", 3)
    assert decide_adoption("a", p) == Adoption(Adopt.OWN, "own state at round 3, then the donor of ['c']", 3,
                                               leader=True, send_to=("c",))
    assert decide_adoption("b", p) == Adoption(Adopt.OWN, "own state at round 3", 3)


def test_only_a_plan_without_a_restore_that_names_carriers_tries_to_carry():
    assert decide_adoption("a", plan(carry=("a", "b", "c"))).try_carry is True
    assert decide_adoption("a", plan()).try_carry is False
    assert decide_adoption("a", plan(carry=("a",), restore=Restore.DONOR, donor="a", joiners=("b",))).try_carry is False


def test_rollback_holds_restores_the_snapshot_or_says_why_it_cannot():
    assert decide_rollback(3, 3, [], 4) == (Rollback.HELD, "holding the state at the start of round 3")
    assert decide_rollback(5, 3, [3, 5], 4) == (Rollback.SNAPSHOT, "own snapshot of round 3")
    assert decide_rollback(None, 3, {2: None}, 4) == (
        Rollback.MISSING, "no snapshot of round 3 (holding mid-round, snapshots [2])")
    assert decide_rollback(2, 5, [1, 2], 4) == (
        Rollback.MISSING, "epoch 4 resumes at round 5, but this site holds the state at the start of round 2 and "
                          "no epoch it received covers rounds 2..4 (snapshots [1, 2])")


def test_carrying_needs_the_same_round_cursor_mode_and_h_mid_round():
    p = plan(carry=("a", "b"))
    assert may_carry(p, None, (3, 288, "local", 4), "local", 4) == (True, "round 3 taken over from cursor 288")
    assert may_carry(p, 3, (3, 288, "local", 4), "local", 4) == (False, "no round in flight")
    assert may_carry(p, None, None, "local", 4) == (False, "no round in flight")
    assert may_carry(p, None, (3, 192, "local", 4), "local", 4) == (
        False, "the round in flight (3 from 192) is not the plan's (3 from 288)")
    assert may_carry(p, None, (3, 288, "local", 4), "local", 8) == (
        False, "the plan's setting (local, H=8) is not the round's (local, H=4)")
    assert may_carry(p, None, (3, 288, "sync", 1), "local", 1)[0] is False
    assert may_carry(plan(), None, (3, 288, "local", 4), "local", 4) == (False, "the plan carries nothing over")
