"""The coordinator's rules as a pure core (coordinator/core.py), on a virtual clock.

The scenario tests drive `core.step` directly: no socket, no file, no real clock; time is an
integer the test advances. The replay of a real four-policy comparison through the core:
tests/live/test_coordinator_core.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from coordinator import core
from coordinator import membership
from ground.config import RunConfig, load_config
from ground.journal import Journal
from ground.plans import Drain, EpochPlan, Plan, Restore
from ground.fields import Rejected
from ground.records import Commit, EpochRecord
from site_core.epochs import not_for_this_process

SITES = ("a", "b", "c")
MS = 1_000_000  # ns
CFG = {"run_id": "core", "cluster": {"sites": list(SITES)}, "wan": {"curve": False, "heartbeat_timeout_ms": 1000},
       "train": {"per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 3 * 96 * 128}}


def config(**recovery: Any) -> RunConfig:
    return load_config({**CFG, "recovery": recovery} if recovery else CFG)


def received(kind: str, src: str, body: dict[str, Any], epoch: int = 0, inc: int = 1) -> core.Received:
    return core.Received(src=src, inc=inc, epoch=epoch, kind=kind, body=body)


def round_done(rnd: int, cs: int, ce: int, phash: str = "ab" * 8) -> dict[str, Any]:
    return {"round": rnd, "step": (rnd + 1) * 4, "param_hash": phash, "cursor_start": cs, "cursor_end": ce,
            "tokens": (ce - cs) * 128, "flops": 1e9}


class Clock:
    """A virtual clock and the core's state: every input goes through `core.step` at `now`."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg, self.now, self.state = cfg, 0, core.initial_state(cfg)
        self.outputs: list[core.Output] = []

    def feed(self, event: core.Received | core.Tick, after_ms: int = 0) -> list[core.Output]:
        self.now += after_ms * MS
        self.state, out = core.step(self.state, event, self.now, self.cfg)
        self.outputs += out
        return out

    def emitted(self, name: str) -> list[dict[str, Any]]:
        return [o.fields for o in self.outputs if isinstance(o, core.Emit) and o.event == name]

    def heartbeats(self, sites: tuple[str, ...], epoch: int) -> None:
        for s in sites:
            self.feed(received("heartbeat", s, {"epoch": epoch}, epoch))


def formed(cfg: RunConfig) -> Clock:
    c = Clock(cfg)
    for s in SITES:
        c.feed(received("join", s, {"pid": 100}))
    c.feed(core.Tick(), after_ms=1)
    return c


def commit_round(c: Clock, rnd: int, cs: int, ce: int, members: tuple[str, ...], epoch: int) -> None:
    for s in members:
        c.feed(received("round_done", s, round_done(rnd, cs, ce), epoch))


def test_when_every_site_joined_epoch_one_is_journaled_before_it_is_announced_to_each_site() -> None:
    c = Clock(config())
    for s in SITES[:2]:
        c.feed(received("join", s, {"pid": 100}))
    assert c.feed(core.Tick(), after_ms=1) and c.state.membership.epoch == 0  # still waiting for c
    c.feed(received("join", "c", {"pid": 100}))
    out = c.feed(core.Tick(), after_ms=1)
    kinds = [type(o).__name__ for o in out]
    assert kinds.index("Journal") < kinds.index("Send"), kinds
    (epoch,) = c.emitted("membership_epoch")
    assert epoch["members"] == list(SITES) and epoch["reason"] == "all 3 expected sites joined"
    sends = [o for o in out if isinstance(o, core.Send)]
    assert sorted(o.to for o in sends) == list(SITES)
    plan = EpochPlan.from_body(sends[0].body, 1, frozenset(SITES))
    assert plan.members == SITES and plan.restore == Restore.NONE and plan.target_samples == 3 * 96


def test_a_round_commits_when_every_member_reported_the_same_hash_and_the_record_is_durable_first() -> None:
    c = formed(config())
    for s in SITES[:2]:
        assert not c.feed(received("round_done", s, round_done(0, 0, 96), 1))  # waits for the last member
    out = c.feed(received("round_done", "c", round_done(0, 0, 96), 1))
    assert isinstance(out[0], core.Journal) and out[0].record["commit_id"] == "e1r0"
    (commit,) = c.emitted("commit")
    assert commit["members"] == list(SITES) and commit["useful_tokens"] == 96 * 128
    assert c.state.committed_round == 0 and c.state.committed_cursor == 96 and c.state.tip == "e1r0"


def test_different_parameter_hashes_refuse_the_commit() -> None:
    c = formed(config())
    for s, h in zip(SITES, ("ab" * 8, "ab" * 8, "cd" * 8)):
        c.feed(received("round_done", s, round_done(0, 0, 96, phash=h), 1))
    assert c.emitted("commit_refused")[0]["reason"] == "parameter hashes differ" and c.state.committed_round == -1


def test_a_silent_member_is_suspected_then_failed_and_elastic_continues_without_it_on_the_virtual_clock() -> None:
    c = formed(config(policy="elastic"))
    commit_round(c, 0, 0, 96, SITES, 1)
    for _ in range(3):  # a and c keep heartbeating; b is silent
        c.heartbeats(("a", "c"), 1)
        c.feed(core.Tick(), after_ms=500)
    assert c.emitted("site_suspected")[0]["site"] == "b"
    assert c.state.membership.sites["b"].state in (membership.SiteState.SUSPECT, membership.SiteState.FAILED)
    for _ in range(4):
        c.heartbeats(("a", "c"), 1)
        c.feed(core.Tick(), after_ms=500)
    assert c.state.membership.sites["b"].state == membership.SiteState.FAILED
    assert c.state.membership.epoch == 2 and c.state.membership.members == ("a", "c")
    last = c.emitted("membership_epoch")[-1]
    assert last["policy"] == "elastic" and not last["paused"] and last["start_round"] >= 1


def test_a_batch_of_heartbeats_is_one_received_heartbeat_each_in_order() -> None:
    """core.Messages of heartbeats (the simulator's unlogged input: an instant's heartbeats as one input)
    gives the state and outputs of one Received heartbeat each, in order, in every case `Rules._heartbeats`
    either takes in its common pass or hands to `handle`: a known member in the current epoch, a heartbeat of no
    epoch yet, a failed non-member still beating in its old epoch (it is sent the plan), an unknown
    site, an unannounced header or heartbeat epoch, a raw (unbuilt) body, a bad body, and a site whose
    incarnation a recovered coordinator does not know yet (learned from its heartbeat)."""
    from ground.messages import Built, Heartbeat

    cfg = config(policy="elastic")
    c = formed(cfg)
    commit_round(c, 0, 0, 96, SITES, 1)
    for _ in range(7):  # b is silent until it fails: epoch 2 of a and c
        c.heartbeats(("a", "c"), 1)
        c.feed(core.Tick(), after_ms=500)
    assert c.state.membership.epoch == 2 and c.state.membership.sites["b"].state == membership.SiteState.FAILED
    # c as a recovered coordinator knows it: incarnation 0 until it speaks (learned once, not changed after).
    m = c.state.membership
    state = dataclasses.replace(c.state, membership=dataclasses.replace(
        m, sites={**m.sites, "c": dataclasses.replace(m.sites["c"], incarnation=0)}))

    def hb(src: str, epoch: int, hb_epoch: int, inc: int = 1) -> tuple[str, int, int, str, Any]:
        return (src, inc, epoch, "heartbeat", Built(Heartbeat(7, hb_epoch, 3)))

    beats = (hb("a", 2, 2), hb("c", 2, 0, inc=5), hb("b", 1, 1), hb("zz", 2, 2), hb("a", 3, 2), hb("c", 2, 5),
             ("a", 1, 2, "heartbeat", {"epoch": 2, "round": 3}), ("c", 1, 2, "heartbeat", {"epoch": "x"}),
             hb("a", 2, 2, inc=4), hb("c", 2, 2, inc=5), hb("c", 2, 2, inc=6))
    # One body shared by several sites, as the simulator's (known good by its identity after the first),
    # around messages that go through `handle`; and a shared one of an unannounced epoch (never good).
    good, bad = Built(Heartbeat(7, 2, 3)), Built(Heartbeat(7, 4, 3))
    beats += (("a", 1, 2, "heartbeat", good), ("zz", 1, 2, "heartbeat", good), ("c", 5, 2, "heartbeat", good),
              ("c", 5, 2, "heartbeat", bad), ("a", 1, 2, "heartbeat", bad), ("a", 1, 3, "heartbeat", good),
              ("c", 5, 2, "heartbeat", good))
    now = c.now + 200 * MS
    folded, want = state, []
    for m in beats:
        folded, out = core.step(folded, core.Received(*m), now, cfg)
        want += out
    got_state, got = core.step(state, core.Messages("heartbeat", beats), now, cfg)
    assert got == want and got_state == folded
    assert [o.to for o in got if isinstance(o, core.Send)] == ["b"]  # the failed member told to rejoin
    rejected = [o.fields["reason"].split(":")[0] for o in got if isinstance(o, core.Emit)]
    assert rejected == ["future_epoch", "future_epoch", "bad_body"] + ["future_epoch"] * 3, rejected
    sites = got_state.membership.sites
    assert sites["a"].last_heartbeat_ns == now and sites["a"].incarnation == 1 and sites["c"].incarnation == 5


def test_a_batch_of_round_reports_is_one_received_report_each_in_order() -> None:
    """core.Messages of round reports gives the state and outputs of one Received each, in order, in every
    case `commits.round_reports` either hands to the report's handler directly or to `handle`: members'
    built reports (the last one commits the round), a raw report, an unannounced header epoch, a
    non-member's report, a built body of the wrong type, a bad raw body, a report too far ahead, and a
    message of another kind in the batch; reports with a built cycle, a cycle map (good or malformed)
    and none, a member's report again or in an older epoch, and the next round's reports after the
    commit; and a batch of joins goes through `handle` one by one."""
    from control.observations import SiteCycle
    from ground.messages import Built, Heartbeat, RoundDone

    cfg = config(policy="elastic")
    c = formed(cfg)
    commit_round(c, 0, 0, 96, SITES, 1)
    cyc = SiteCycle(0.5, 8, 0.1, 1000, 4.2, 1.0, 0.9, 0.95)

    def built(src: str, rnd: int, cs: int, ce: int, epoch: int = 1, cycle: Any = None) -> tuple[str, int, int, str, Any]:
        b = round_done(rnd, cs, ce)
        return (src, 1, epoch, "round_done", Built(RoundDone(rnd, b["step"], b["param_hash"], cs, ce, b["tokens"],
                                                             b["flops"], ()), {"cycle": cycle} if cycle else None))

    reports = (built("a", 1, 96, 192, cycle=cyc), ("b", 1, 1, "round_done", round_done(1, 96, 192)),
               built("a", 1, 96, 192, 5), built("zz", 1, 96, 192), ("c", 1, 1, "round_done", Built(Heartbeat(1, 1, 1))),
               ("c", 1, 1, "round_done", {"round": "x"}), built("c", 40, 96, 192), built("a", 1, 96, 192),
               built("b", 1, 96, 192, 0),
               built("b", 1, 96, 192, cycle=cyc.to_json()), built("b", 1, 96, 192, cycle={"compute_s": "x"}),
               ("c", 1, 1, "heartbeat", {"epoch": 1}), built("c", 1, 96, 192, cycle=cyc),
               built("a", 2, 192, 288, cycle=cyc), built("b", 2, 192, 288), built("b", 2, 192, 288, cycle=cyc))
    now = c.now + 50 * MS
    for kind, batch in (("round_done", reports), ("join", (("a", 1, 0, "join", {"pid": 1}),
                                                          ("q", 1, 0, "join", {"pid": 2})))):
        folded, want = c.state, []
        for m in batch:
            folded, out = core.step(folded, core.Received(*m), now, cfg)
            want += out
        got_state, got = core.step(c.state, core.Messages(kind, batch), now, cfg)
        assert got == want and got_state == folded, kind
    assert got_state.committed_round == 0  # (the joins' batch: nothing committed in it)
    state, out = core.step(c.state, core.Messages("round_done", reports), now, cfg)
    assert state.committed_round == 1 and [o.fields["commit_id"] for o in out if isinstance(o, core.Emit)
                                           and o.event == "commit"] == ["e1r1"]
    reasons = [o.fields["reason"].split(":")[0] for o in out
               if isinstance(o, core.Emit) and o.event == "report_rejected"]
    assert reasons == ["future_epoch", "epoch 1 is not current 1 or not a member", "bad_body", "bad_body",
                       "round 40 is more than 8 rounds past the commit record (0)",
                       "epoch 0 is not current 1 or not a member"], reasons
    assert dict(state.reports) == {(1, 2): {"a": reports[-3][4].typed, "b": reports[-1][4].typed}}
    assert state.settings is not None and state.settings.cycles[(1, 2)] == {"a": cyc, "b": cyc}


def test_the_oracle_drains_ahead_of_the_fault_and_the_drain_is_a_field_of_the_plan_it_sends() -> None:
    c = formed(config(policy="oracle", oracle_faults=[["b", 250 * 128]]))
    commit_round(c, 0, 0, 96, SITES, 1)
    out = c.feed(core.Tick(), after_ms=1)
    assert c.state.plan is not None and c.state.plan.drain == Drain("b", 250)
    (epoch,) = [e for e in c.emitted("membership_epoch") if e["drain"]]
    assert epoch["drain"] == {"site": "b", "at_cursor": 250} and "b" not in epoch["members"]
    bodies = [EpochPlan.from_body(o.body, o.epoch, frozenset(SITES)) for o in out if isinstance(o, core.Send)]
    assert bodies and all(b.drain == Drain("b", 250) and b.checkpoint_first for b in bodies)
    assert ("b", 1) in c.state.oracle_dropped
    c.feed(received("join", "b", {"pid": 7}, 0))  # the same incarnation may not come back
    assert c.emitted("join_deferred")


def test_the_run_completes_when_every_member_is_done_at_the_target_and_every_site_is_told() -> None:
    c = formed(config())
    for r in range(3):
        commit_round(c, r, 96 * r, 96 * (r + 1), SITES, 1)
    for s in SITES:
        c.feed(received("site_done", s, {"round": 2}, 1))
    out = c.feed(core.Tick(), after_ms=1)
    assert c.emitted("run_complete")[0]["useful_tokens"] == 3 * 96 * 128 and c.state.shutdown_sent
    assert sorted(o.to for o in out if isinstance(o, core.Send) and o.kind == "shutdown") == list(SITES)
    assert not [o for o in c.feed(core.Tick(), after_ms=1) if isinstance(o, core.Send)]  # said once


def test_step_is_pure_the_input_state_is_untouched_and_the_same_input_gives_the_same_output() -> None:
    cfg = config(policy="elastic")
    c = formed(cfg)
    commit_round(c, 0, 0, 96, SITES[:2], 1)  # two of three reports are pending
    before = c.state
    snapshot = (before.membership, dict(before.reports), before.commits, before.committed_cursor)
    ev = received("round_done", "c", round_done(0, 0, 96), 1)
    s1, o1 = core.step(before, ev, 5 * MS, cfg)
    s2, o2 = core.step(before, ev, 5 * MS, cfg)
    assert (before.membership, dict(before.reports), before.commits, before.committed_cursor) == snapshot
    assert s1 == s2 and o1 == o2 and s1.committed_cursor == 96 and before.committed_cursor == 0


def test_a_restart_from_the_journal_rebuilds_the_same_commit_record_and_settles_first(tmp_path: Path) -> None:
    cfg = config()
    c = formed(cfg)
    commit_round(c, 0, 0, 96, SITES, 1)
    records = [o.record for o in c.outputs if isinstance(o, core.Journal)]
    state, out = core.recover(records, None, 10 * MS, cfg)
    assert (state.membership.epoch, state.membership.members, state.tip, state.committed_cursor) == (1, SITES, "e1r0", 96)
    assert state.settle_until_ns == 10 * MS + 1000 * MS and any(isinstance(o, core.Fence) for o in out)
    s2, _ = core.step(state, core.Tick(), 20 * MS, cfg)  # settling: no new epoch although nobody heartbeats
    assert s2.membership.epoch == 1


def test_the_journal_records_are_typed_and_read_back_equal_from_the_journal_file(tmp_path: Path) -> None:
    c = formed(config(policy="oracle", oracle_faults=[["b", 250 * 128]]))
    commit_round(c, 0, 0, 96, SITES, 1)
    c.feed(core.Tick(), after_ms=1)  # the drain's epoch
    j = Journal(tmp_path / "journal.jsonl")
    for o in c.outputs:
        if isinstance(o, core.Journal):
            j.append(o.record)
    j.close()
    records, problem = Journal.load(tmp_path / "journal.jsonl")
    assert problem is None
    commits = [Commit.from_json(r) for r in records if r["type"] == "commit"]
    epochs = [EpochRecord.from_json(r) for r in records if r["type"] == "epoch"]
    assert commits == list(c.state.commits) and commits[0].useful_tokens == 96 * 128
    assert [e.epoch for e in epochs] == [1, 2] and epochs[1].plan.drain == Drain("b", 250)
    assert epochs[1].held_out == (("b", 1),) and epochs[1].checkpoint_first
    assert epochs[0].plan == Plan(SITES, False, 0, 0, Restore.NONE, incarnations=(("a", 1), ("b", 1), ("c", 1)))


def test_a_site_restarted_while_the_coordinator_was_down_does_not_adopt_the_recovered_epoch() -> None:
    """Soak seed 1008: the coordinator crashed right after e1r0 and site a was killed and restarted
    while it was down. The recovered coordinator re-announced epoch 1, the new a adopted it and
    trained round 0 again (counted twice under e1r0). Now epoch 1 names the incarnations it was
    made for, the new process skips it, and the epoch that admits it names its own incarnation."""
    cfg = config()
    c = formed(cfg)  # every site joined with incarnation 1
    commit_round(c, 0, 0, 96, SITES, 1)
    records = [o.record for o in c.outputs if isinstance(o, core.Journal)]
    state, _ = core.recover(records, None, 10 * MS, cfg)
    assert {s: r.incarnation for s, r in state.membership.sites.items()} == {"a": 1, "b": 1, "c": 1}
    (again,) = [o for o in core.announce_current(state, cfg) if o.to == "a"]
    plan = EpochPlan.from_body(again.body, 1, frozenset(SITES))
    assert plan.incarnation_of("a") == 1
    assert not_for_this_process(plan, "a", 1) is None  # the process it was made for adopts it
    assert not_for_this_process(plan, "a", 7) == "epoch 1 was made for incarnation 1 of a, not this process (7)"
    r = Clock(cfg)
    r.state, r.now = state, 10 * MS
    r.feed(received("join", "a", {"pid": 200}, 0, inc=7), after_ms=1)  # the restarted a
    for _ in range(3):
        r.feed(core.Tick(), after_ms=500)
        r.heartbeats(("b", "c"), 1)
    admitted = [EpochPlan.from_body(o.body, o.epoch, frozenset(SITES)) for o in r.outputs
                if isinstance(o, core.Send) and o.kind == "membership" and o.to == "a"]
    named = [p for p in admitted if "a" in p.members or "a" in p.joiners]
    assert named and all(p.incarnation_of("a") in (None, 7) for p in named)
    assert any(p.incarnation_of("a") == 7 for p in named if "a" in p.members)


def test_a_plan_body_with_bad_incarnations_is_rejected() -> None:
    body = EpochPlan.announce(2, Plan(("a", "b"), False, 3, 288, Restore.NONE, incarnations=(("a", 5),)),
                              target_samples=1000, frontier_manifest=None, checkpoint_first=False).to_body()
    assert body["incarnations"] == {"a": 5}
    assert EpochPlan.from_body(body, 2, frozenset(SITES)).incarnation_of("a") == 5
    for bad in ({"c": 5}, {"a": 0}, {"a": "x"}, ["a", 5]):
        with pytest.raises(Rejected):
            EpochPlan.from_body({**body, "incarnations": bad}, 2, frozenset(SITES))


def test_a_donor_restore_plan_carries_the_commit_records_parameter_hash_not_the_donors_word() -> None:
    """Under stall, b fails after round 0 commits and a and c wait for it; b comes back and the plan
    that gives it a's state from round 1 names the hash of round 0's commit, which the restored
    state must have (issue 54). A rejoin scheduled for a later boundary (elastic: the round in flight
    first) names none: that round is not committed when the plan is made."""
    c = formed(config(policy="stall"))
    commit_round(c, 0, 0, 96, SITES, 1)
    for _ in range(8):  # b is silent until it is failed
        c.heartbeats(("a", "c"), 1)
        c.feed(core.Tick(), after_ms=500)
    assert c.state.membership.sites["b"].state == membership.SiteState.FAILED
    epoch = c.state.membership.epoch
    c.feed(received("join", "b", {"pid": 101}, inc=2))
    c.heartbeats(("a", "c"), epoch)
    out = c.feed(core.Tick(), after_ms=10)
    sends = [o for o in out if isinstance(o, core.Send) and o.kind == "membership"]
    plan = EpochPlan.from_body(sends[0].body, c.state.membership.epoch, frozenset(SITES))
    assert plan.restore == Restore.DONOR and plan.joiners == ("b",) and plan.start_round == 1, plan
    assert plan.params_hash == "ab" * 8  # the commit of round 0, the round before the plan's first
    assert c.state.plan is not None and c.state.plan.params_hash == "ab" * 8


def test_a_plans_parameter_hash_survives_the_journal_and_the_message_and_a_bad_one_is_refused() -> None:
    plan = Plan(("a", "b"), False, 5, 320, Restore.DONOR, donor="a", joiners=("b",), params_hash="ef" * 32)
    assert Plan.from_json(plan.to_json()).params_hash == "ef" * 32
    assert "params_hash" not in dataclasses.replace(plan, params_hash=None).to_json()  # absent unless set
    assert plan == dataclasses.replace(plan, params_hash=None)  # not part of the decision's identity
    body = EpochPlan.announce(3, plan, target_samples=1000, frontier_manifest=None, checkpoint_first=False).to_body()
    assert EpochPlan.from_body(body, 3, frozenset(SITES)).params_hash == "ef" * 32
    with pytest.raises(Rejected, match="params_hash"):
        EpochPlan.from_body({**body, "params_hash": "not hex"}, 3, frozenset(SITES))
