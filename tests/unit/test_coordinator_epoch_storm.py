"""Epochs announced back to back (issue 9): an active member's re-join is not its death, and the
oracle anticipates each fault once, across rollbacks and coordinator restarts.

The reported run: the oracle drained b "from round 2" and, 90 ms later, c "from round 3" (epochs
2 and 3). Site a, still finishing round 1, went straight to epoch 3, could not restore, and asked
to re-join; the coordinator took that for a's death ("['a'] failed; [] wait") and restarted the
cluster from the initial weights. Reproduced here on a real `Coordinator` fed the same messages
(pure logic: no sockets), then the fix: a gets epoch 3's plan again.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coordinator import membership
from coordinator.recovery import OracleFaults
from ground.plans import Drain, Plan, Restore
from site_agent.messages import parse_plan
from tests.unit.test_coordinator_messages import SITES, formed, logged, make, msg, round_done, sent

# 3 sites x 8 samples x 4 inner steps = 96 samples a round (64 with two members); seq_len 128.
# b's fault fires when the commit record reaches cursor 250, c's at 300.
ORACLE = {"policy": "oracle", "oracle_faults": [["b", 250 * 128], ["c", 300 * 128]]}


def commit_round(c, rnd: int, cs: int, ce: int, members: tuple[str, ...], epoch: int) -> None:
    for s in members:
        c.handle(msg("round_done", s, round_done(rnd, cs, ce), epoch=epoch), 10)
    assert c.committed_round == rnd and c.committed_cursor == ce, logged(c, "report_rejected")


def storm(tmp_path: Path):
    """Drive the coordinator to epoch 3 = [a], with b drained from round 2 and c from round 3."""
    c = formed(tmp_path, **ORACLE)
    commit_round(c, 0, 0, 96, SITES, 1)
    c.step_membership(20)
    assert c.membership.epoch == 2 and c.plan == Plan(("a", "c"), False, 2, 192, Restore.NONE, drain=Drain("b", 250))
    commit_round(c, 1, 96, 192, SITES, 1)  # the round in flight at the boundary commits under epoch 1
    c.step_membership(30)
    assert c.membership.epoch == 3 and c.plan == Plan(("a",), False, 3, 256, Restore.NONE, drain=Drain("c", 300))
    return c


def test_back_to_back_drains_then_an_active_members_rejoin_gets_its_plan_again(tmp_path: Path) -> None:
    c = storm(tmp_path)
    c.node._outbox.clear()
    # a skipped to epoch 3, could not restore round 3, and asks to be admitted again.
    c.handle(msg("join", "a", {"pid": 100, "rejoin": True}, epoch=3), 40)
    (ans,) = logged(c, "rejoin_answered")
    assert ans["site"] == "a" and "could not apply epoch 3" in ans["reason"] and ans["state"] == "active"
    assert c.membership.sites["a"].state == membership.SiteState.ACTIVE and c.membership.members == ("a",)
    (dest, plan_msg), = sent(c)
    assert dest == "a" and plan_msg.kind == "membership" and plan_msg.body["epoch"] == 3
    c.step_membership(50)
    decisions = [e["reason"] for e in logged(c, "recovery_decision")]
    assert not any("failed" in r for r in decisions), decisions
    assert c.membership.epoch == 3 and not logged(c, "site_joined")[3:]  # only the three first joins


def test_a_rejoin_sent_before_the_member_knew_the_current_epoch_is_answered_with_the_plan(tmp_path: Path) -> None:
    c = storm(tmp_path)
    for _ in range(3):  # however often: it asked from epoch 1
        c.handle(msg("join", "a", {"pid": 100, "rejoin": True}, epoch=1), 40)
    assert len(logged(c, "rejoin_answered")) == 3 and c.membership.sites["a"].state == membership.SiteState.ACTIVE


def test_an_active_member_failing_the_same_plan_twice_has_lost_its_state_and_rejoins_as_a_joiner(
        tmp_path: Path) -> None:
    c = storm(tmp_path)
    c.handle(msg("join", "a", {"pid": 100, "rejoin": True}, epoch=3), 40)
    c.handle(msg("join", "a", {"pid": 100, "rejoin": True}, epoch=3), 41)
    assert len(logged(c, "rejoin_answered")) == 1
    assert c.membership.sites["a"].state == membership.SiteState.JOINING  # no endless resend loop
    assert logged(c, "site_joined")[-1]["previous_state"] == "active"


def test_a_restarted_member_is_never_taken_for_the_active_one(tmp_path: Path) -> None:
    c = storm(tmp_path)
    restarted = msg("join", "a", {"pid": 999, "rejoin": True}, epoch=3)
    c.handle(restarted.__class__(**{**restarted.__dict__, "inc": 12345}), 40)
    assert not logged(c, "rejoin_answered") and c.membership.sites["a"].state == membership.SiteState.JOINING


def test_the_drain_is_a_typed_field_of_the_plan_the_site_can_parse(tmp_path: Path) -> None:
    c = storm(tmp_path)
    plans = [m for d, m in sent(c) if m.kind == "membership" and m.body["epoch"] == 3]
    assert plans and plans[0].body["drain"] == {"site": "c", "at_cursor": 300}
    assert plans[0].body["checkpoint_first"] is True  # the continuing leader checkpoints at the drain
    p = parse_plan(plans[0], frozenset(SITES), "coord")
    assert p.epoch == 3 and tuple(p.members) == ("a",) and p.start_round == 3
    epochs = logged(c, "membership_epoch")
    assert [e["drain"] for e in epochs] == [None, {"site": "b", "at_cursor": 250}, {"site": "c", "at_cursor": 300}]


def test_each_fault_is_anticipated_once_even_after_a_rollback_below_it(tmp_path: Path) -> None:
    c = storm(tmp_path)
    assert c.oracle.drained == frozenset({0, 1}) and c.view().drop_before == ()
    # The faults fire and heal; b and c come back as new incarnations; then a rollback to the
    # initial weights puts the cursor back to 0, far below both triggers.
    c.state = replace(c.state, committed_round=-1, committed_cursor=0)
    for s, inc in (("b", 220), ("c", 330)):
        c.handle(msg("join", s, {"pid": 7}).__class__(**{**msg("join", s, {"pid": 7}).__dict__, "inc": inc}), 60)
    assert c.view().drop_before == ()
    c.step_membership(70)
    assert not [e for e in logged(c, "membership_epoch") if e["epoch"] > 3 and e["drain"]]


def test_a_restarted_coordinator_remembers_spent_faults_and_held_out_incarnations(tmp_path: Path) -> None:
    c = storm(tmp_path)
    c.journal.close()
    c2 = make(tmp_path, **ORACLE)
    assert c2.membership.epoch == 3 and c2.oracle.drained == frozenset({0, 1}) and c2.view().drop_before == ()
    assert c2.oracle_dropped == {("b", 22), ("c", 33)}
    c2.handle(msg("join", "b", {"pid": 100, "rejoin": True}, epoch=3), 5)  # the drained incarnation
    assert logged(c2, "join_deferred")


def test_oracle_faults_spent_by_drain_or_by_the_commit_record_never_come_back() -> None:
    f = OracleFaults((("b", 300), ("b", 900), ("c", 500)))
    assert f.ahead() == (("b", 300), ("b", 900), ("c", 500))
    f = f.after_plan(Plan(("a", "c"), False, 3, 288, Restore.NONE, drain=Drain("b", 300)))
    assert f.ahead() == (("b", 900), ("c", 500))  # b's second fault is still to be anticipated
    f = f.after_commit(600)  # c's fault passed without a drain (c was not a member then)
    assert f.ahead() == (("b", 900),)
    f = f.after_commit(96)  # a rollback: the highest cursor ever reached stays
    assert f.ahead() == (("b", 900),) and f.passed_cursor == 600
