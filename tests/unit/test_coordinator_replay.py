"""A coordinator restarted from its journal remembers what it remembered before the crash.

Soak seed 1005 under `oracle`: the coordinator crashed 0.9 s after draining a site. Restarted, it
knew the current epoch but not the previous one, refused the previous epoch's in-flight round
reports (and the leader's durable checkpoint of a committed round), resynced the members back
past snapshots they no longer held, and the cluster churned on store restores of a frontier the
store no longer served until the run timed out. The pure replay first, then a real `Coordinator`
(its journal, its log, its endpoint not started) crashed and restarted mid-storm.
"""

from __future__ import annotations

import json

import time
from pathlib import Path

from ground.plans import Drain, Plan, Restore
from coordinator.replay import (EPOCHS_KEPT, RecentEpochs, after_epoch, fence_floor, pending_checkpoints,
                                recent_epochs, remember_epoch)
from tests.unit.test_coordinator_epoch_storm import ORACLE, commit_round, storm
from tests.unit.test_coordinator_messages import INC, SITES, formed, logged, make, msg, round_done


def epoch_record(epoch: int, members: tuple[str, ...], drain: Drain | None = None, **extra) -> dict:
    plan = Plan(members, False, epoch, epoch * 64, Restore.NONE, drain=drain)
    return {"type": "epoch", "epoch": epoch, "plan": plan.to_json(), "reason": "t", "held_out": [], **extra}


def test_replay_remembers_the_same_recent_epochs_as_the_live_coordinator() -> None:
    members = [("a", "b", "c"), ("a", "c"), ("a",), ("a", "b"), ("a", "b", "c"), ("b", "c"), ("c",)]
    live, records = RecentEpochs(), []
    for i, m in enumerate(members, start=1):
        live = after_epoch(live, i, m, checkpoint_first=(i == 3))
        records.append(epoch_record(i, m, checkpoint_first=(i == 3)))
        records.append({"type": "commit", "round": i, "epoch": i})  # other records are ignored
        assert recent_epochs(records) == live
    assert live.epoch == 7 and live.members == ("c",)
    assert live.epoch_members == {3: ("a",), 4: ("a", "b"), 5: ("a", "b", "c"), 6: ("b", "c")}
    assert min(live.epoch_members) == 7 - EPOCHS_KEPT and live.fence == 3
    assert live.checkpoint_first_epoch == 3


def test_an_empty_journal_remembers_nothing_and_fences_at_the_current_epoch() -> None:
    assert recent_epochs([]) == RecentEpochs() and RecentEpochs().fence == 0
    assert fence_floor({}, 5) == 5 and remember_epoch({}, 0, (), 1) == {}


def test_a_journal_from_before_checkpoint_first_was_recorded_reads_a_drain_as_checkpoint_first() -> None:
    records = [epoch_record(1, ("a", "b")), epoch_record(2, ("a",), drain=Drain("b", 200))]
    assert recent_epochs(records).checkpoint_first_epoch == 2


def test_pending_checkpoints_are_replayed_until_a_frontier_passes_them() -> None:
    records = [{"type": "checkpoint_pending", "round": 3, "cursor": 352, "manifest_hash": "aa"},
               {"type": "checkpoint_pending", "round": 5, "cursor": 448, "manifest_hash": "bb"},
               {"type": "frontier", "round": 3, "cursor": 352, "manifest_hash": "aa", "commit_id": "e7r3"}]
    assert pending_checkpoints(records) == {(5, 448): "bb"}
    assert pending_checkpoints(records[:2]) == {(3, 352): "aa", (5, 448): "bb"}


def test_a_restarted_coordinator_commits_the_previous_epochs_round_in_flight(tmp_path: Path) -> None:
    c = storm(tmp_path)  # epoch 2 = [a, c] from round 2 (b drained), epoch 3 = [a] from round 3 (c drained)
    before = (dict(c.epoch_members), c.node.fence.epoch, c.checkpoint_first_epoch)
    c.journal.close()
    c2 = make(tmp_path, **ORACLE)  # the crash: everything not in the journal is gone
    assert (c2.membership.epoch, c2.membership.members) == (3, ("a",))
    assert (dict(c2.epoch_members), c2.node.fence.epoch, c2.checkpoint_first_epoch) == before
    assert c2.epoch_members[2] == ("a", "c")
    (rec,) = logged(c2, "coordinator_recovered")
    assert rec["recent_epochs"] == {"1": ["a", "b", "c"], "2": ["a", "c"]} and rec["fence_epoch"] == 1
    # a and c finished round 2 under epoch 2 while the coordinator was down; the reports come again.
    commit_round(c2, 2, 192, 256, ("a", "c"), 2)
    assert not logged(c2, "report_rejected") and not logged(c2, "commit_refused")
    assert [e["commit_id"] for e in logged(c2, "commit")][-1] == "e2r2"
    c2.step_membership(10**12)  # past the settling time: no resync, no new epoch
    assert c2.membership.epoch == 3 and not c2.resync


def test_a_restarted_coordinator_accepts_the_previous_epochs_durable_checkpoint(tmp_path: Path) -> None:
    c = storm(tmp_path)
    c.journal.close()
    c2 = make(tmp_path, **ORACLE)
    body = {"round": 1, "cursor": 192, "manifest_hash": "cd" * 32}
    c2.handle(msg("checkpoint_durable", "a", body, epoch=1), 5)  # round 1 committed under epoch 1
    assert not logged(c2, "report_rejected")
    assert c2.frontier is not None and (c2.frontier.round, c2.frontier.commit_id) == (1, "e1r1")


def test_a_checkpoint_durable_before_its_commit_survives_a_restart(tmp_path: Path) -> None:
    c = storm(tmp_path)
    c.handle(msg("checkpoint_durable", "a", {"round": 2, "cursor": 256, "manifest_hash": "ef" * 32}, epoch=2), 5)
    assert logged(c, "frontier_deferred") and c.frontier is None
    c.journal.close()
    c2 = make(tmp_path, **ORACLE)
    assert c2.pending_frontiers == {(2, 256): "ef" * 32}
    commit_round(c2, 2, 192, 256, ("a", "c"), 2)
    assert c2.frontier is not None and (c2.frontier.round, c2.frontier.manifest_hash) == (2, "ef" * 32)
    assert c2.frontier.commit_id == "e2r2"
    c2.journal.close()
    c3 = make(tmp_path, **ORACLE)  # and once it is the frontier, nothing is pending any more
    assert c3.pending_frontiers == {} and c3.frontier == c2.frontier


# ------------------------------------------------ epochs formed while an older epoch's round is in flight


def test_a_new_epoch_keeps_the_partial_reports_of_a_remembered_epochs_round_in_flight(tmp_path: Path) -> None:
    """Soak seed 1005 (oracle): a's report of round 6 (epoch 2) was dropped when epoch 5 formed before
    c's came; round 6 never committed, and the members were resynced back past their snapshots."""
    c = formed(tmp_path, **ORACLE)
    commit_round(c, 0, 0, 96, SITES, 1)
    c.step_membership(20)  # epoch 2 = [a, c] from round 2: b drained; round 1 in flight under epoch 1
    assert c.membership.epoch == 2 and c.plan.start_round == 2
    c.handle(msg("round_done", "a", round_done(1, 96, 192), epoch=1), 21)
    restarted = msg("join", "b", {"pid": 7})
    c.handle(restarted.__class__(**{**restarted.__dict__, "inc": 222}), 22)  # a new b: rejoins at round 2
    c.step_membership(23)
    assert c.membership.epoch == 3 and c.plan.members == SITES
    for s in ("b", "c"):
        c.handle(msg("round_done", s, round_done(1, 96, 192), epoch=1), 24)
    assert c.committed_round == 1 and [e["commit_id"] for e in logged(c, "commit")] == ["e1r0", "e1r1"]


def test_a_change_planned_before_the_current_epoch_began_takes_effect_at_its_boundary(tmp_path: Path) -> None:
    """The rejoin planned right after a drain must start where the drain starts (round 2 at 192, after
    the three-site round 1 in flight), not one single-member round after the commit record."""
    c = formed(tmp_path, **ORACLE)
    commit_round(c, 0, 0, 96, SITES, 1)
    c.step_membership(20)
    assert c.plan == Plan(("a", "c"), False, 2, 192, Restore.NONE, drain=Drain("b", 250))
    assert c.view().scheduled == (2, 192)
    restarted = msg("join", "b", {"pid": 7})
    c.handle(restarted.__class__(**{**restarted.__dict__, "inc": 222}), 22)
    c.step_membership(23)
    assert (c.plan.start_round, c.plan.start_cursor, c.plan.restore) == (2, 192, Restore.DONOR)
    commit_round(c, 1, 96, 192, SITES, 1)
    assert c.view().scheduled is None  # the boundary is reached: the next change is after the next round


def test_a_restarted_coordinator_knows_incarnations_from_the_journal_and_holds_the_drained_one_out(
        tmp_path: Path) -> None:
    c = formed(tmp_path, policy="oracle", oracle_faults=[["c", 300 * 128]])
    commit_round(c, 0, 0, 96, SITES, 1)
    c.journal.close()
    c2 = make(tmp_path, policy="oracle", oracle_faults=[["c", 300 * 128]])
    # The epoch record names the incarnations its plan was made for (soak seed 1008).
    assert {n: s.incarnation for n, s in c2.membership.sites.items()} == INC
    t = time.monotonic_ns() + 10**10  # past the restart's settling time
    for s in SITES:
        c2.handle(msg("heartbeat", s, {"sent_mono_ns": 1, "epoch": 1}, epoch=1), t)
    assert {n: s.incarnation for n, s in c2.membership.sites.items()} == INC
    commit_round(c2, 1, 96, 192, SITES, 1)
    commit_round(c2, 2, 192, 288, SITES, 1)
    c2.step_membership(t + 1)  # settled; c's fault at 300 is less than two rounds ahead: drained
    assert c2.plan.drain == Drain("c", 300) and ("c", INC["c"]) in c2.oracle_dropped
    c2.handle(msg("join", "c", {"pid": 100, "rejoin": True}, epoch=c2.membership.epoch), t + 2)
    assert logged(c2, "join_deferred")  # the drained, still-live process is not readmitted
    restarted = msg("heartbeat", "a", {"sent_mono_ns": 1, "epoch": 1}, epoch=1)
    c2.handle(restarted.__class__(**{**restarted.__dict__, "inc": 999}), t + 3)
    assert c2.membership.sites["a"].incarnation == INC["a"]  # a known incarnation changes only by a join


def test_a_restarted_coordinator_learns_incarnations_an_old_journal_does_not_name(tmp_path: Path) -> None:
    """A journal written before epochs named incarnations: learned from the first heartbeats."""
    c = formed(tmp_path)
    commit_round(c, 0, 0, 96, SITES, 1)
    c.journal.close()
    path = tmp_path / "coordinator" / "journal.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for r in lines:
        if r["type"] == "epoch":
            r["plan"].pop("incarnations")
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    c2 = make(tmp_path)
    assert {s.incarnation for s in c2.membership.sites.values()} == {0}
    t = time.monotonic_ns() + 10**10
    for s in SITES:
        c2.handle(msg("heartbeat", s, {"sent_mono_ns": 1, "epoch": 1}, epoch=1), t)
    assert {n: s.incarnation for n, s in c2.membership.sites.items()} == INC


def test_an_epoch_journaled_but_not_logged_before_the_crash_is_logged_by_the_restarted_coordinator(
        tmp_path: Path) -> None:
    """Soak seed 1005 (oracle): the coordinator was SIGKILLed between journaling epoch 8 and logging
    it. The restarted one recovered epoch 8 from the journal and announced it; the members committed
    in it, and `fencing` failed: "commit e8r5 in epoch 8, never announced". Now the restarted
    coordinator logs the journal's last epoch when its log lacks it, and only then."""
    c = storm(tmp_path)  # epochs 1, 2 and 3, each journaled and logged
    c.journal.close()
    log = tmp_path / "logs" / "coord.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    cut = max(i for i, x in enumerate(lines) if json.loads(x)["event"] == "membership_epoch")
    assert json.loads(lines[cut])["epoch"] == 3
    log.write_text("".join(lines[:cut]))  # the kill came after the journal's fsync, before the log line
    c2 = make(tmp_path, **ORACLE)
    epochs = logged(c2, "membership_epoch")
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert epochs[-1]["recovered_from_journal"] is True and epochs[-1]["members"] == ["a"]
    assert epochs[-1]["drain"] == {"site": "c", "at_cursor": 300} and epochs[-1]["start_round"] == 3
    c2.journal.close()
    make(tmp_path, **ORACLE)  # restarted again: epoch 3 is in the log now, nothing is logged twice
    assert [e["epoch"] for e in logged(c2, "membership_epoch")] == [1, 2, 3]


def test_only_the_leader_reports_a_durable_checkpoint_near_the_commit_record_and_past_the_frontier(tmp_path: Path) -> None:
    """An insider with a valid key (issue 54) cannot choose the frontier: c is not epoch 1's leader; a round
    far past the commit record would only grow the pending set; a round behind the frontier would move it
    back. Each is rejected with its reason; the leader's own report, and the same report again, are fine."""
    c = storm(tmp_path)  # rounds 0-1 committed under epoch 1 = [a, b, c]
    c.handle(msg("checkpoint_durable", "c", {"round": 1, "cursor": 192, "manifest_hash": "66" * 32}, epoch=1), 5)
    (r,) = logged(c, "report_rejected")
    assert "not the leader: only epoch 1's leader (a)" in r["reason"] and c.frontier is None
    c.handle(msg("checkpoint_durable", "a", {"round": 900, "cursor": 10**6, "manifest_hash": "77" * 32}, epoch=1), 6)
    assert "more than 8 rounds past the commit record" in logged(c, "report_rejected")[-1]["reason"]
    assert (900, 10**6) not in c.pending_frontiers
    good = {"round": 1, "cursor": 192, "manifest_hash": "cd" * 32}
    c.handle(msg("checkpoint_durable", "a", good, epoch=1), 7)
    assert c.frontier is not None and (c.frontier.round, c.frontier.manifest_hash) == (1, "cd" * 32)
    c.handle(msg("checkpoint_durable", "a", good, epoch=1), 8)  # a resend: silent
    assert len(logged(c, "report_rejected")) == 2
    c.handle(msg("checkpoint_durable", "a", {"round": 0, "cursor": 64, "manifest_hash": "ee" * 32}, epoch=1), 9)
    assert "not past the frontier (round 1)" in logged(c, "report_rejected")[-1]["reason"]
    assert c.frontier.round == 1
