"""Consistency settings per epoch: the setting's wire form, the step arithmetic across changes,
the scripted schedule's boundaries, and the coordinator's epoch/step bookkeeping (pure logic)."""

from __future__ import annotations

import pytest

from control.scripted import check_schedule, planned_rounds, setting_at
from ground.setting import (ConsistencySetting, SettingError, effective_config, step_after_round, steps_before)
from coordinator.settings import EpochSettings, due_change, setting_for_epoch
from ground.schedule import samples_per_round, target_samples
from ground.config import load_config

SYNC, L4, L16 = ConsistencySetting("sync", 1), ConsistencySetting("local", 4), ConsistencySetting("local", 16, "int8")
SCRIPT = {"train": {"mode": "scripted", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 250_000,
                    "settings_schedule": [{"at_round": 0, "mode": "sync"},
                                          {"at_round": 3, "mode": "local", "inner_steps_h": 4},
                                          {"at_useful_tokens": 98_304, "mode": "local", "inner_steps_h": 16,
                                           "compression": "int8"},
                                          {"at_round": 14, "mode": "sync"}]}}


def test_setting_roundtrip_and_rejects():
    assert ConsistencySetting.from_json(L16.to_json()) == L16
    assert L16.label() == "local H=16 int8" and SYNC.steps_per_round == 1 and L4.steps_per_round == 4
    for bad in ({"mode": "async"}, {"inner_steps_h": 0}, {"inner_steps_h": True}, {"compression": "zip"},
                {"mode": "sync", "extra": 1}, [1, 2], {"mode": ["sync"]}):
        with pytest.raises(SettingError):
            ConsistencySetting.from_json(bad)


def test_steps_accumulate_each_rounds_own_h():
    # Epoch 1 sync from round 0, epoch 2 local H=4 from round 3, epoch 3 H=16 from round 5.
    eps = [(0, SYNC), (3, L4), (5, L16)]
    assert steps_before(0, 0, eps, 3) == 3
    assert steps_before(0, 0, eps, 5) == 3 + 2 * 4
    assert steps_before(0, 0, eps, 7) == 3 + 8 + 2 * 16
    # From an anchor in the middle (the commit record), the same numbers.
    assert steps_before(4, 7, eps, 7) == 7 + 4 + 32
    # A later epoch replans rounds from its start (a rollback to round 4 in sync): it governs them.
    assert steps_before(0, 0, eps + [(4, SYNC)], 7) == 3 + 4 + 3 * 1
    assert step_after_round(11, 5, 6, L16) == 11 + 2 * 16
    with pytest.raises(ValueError):
        step_after_round(0, 5, 4, L4)


def test_scripted_schedule_boundaries_and_plan():
    cfg = load_config(SCRIPT)
    check_schedule(cfg)
    assert setting_at(cfg, 0, 0) == (SYNC, 0)
    assert setting_at(cfg, 3, 72) == (L4, 1)
    # 98,304 tokens = 768 samples: the first boundary at or past it.
    assert setting_at(cfg, 5, 767)[0] == L4 and setting_at(cfg, 5, 768)[0] == L16
    rounds = planned_rounds(cfg, 3, target_samples(cfg))
    # The rounds tile the samples without gap or overlap, each with its own setting's size.
    assert rounds[0][1] == 0 and rounds[-1][2] == target_samples(cfg)
    for (r0, _c0, e0, s0), (r1, c1, _e1, _s1) in zip(rounds, rounds[1:]):
        assert r1 == r0 + 1 and c1 == e0
    for r, c, e, s in rounds[:-1]:
        assert e - c == samples_per_round(effective_config(cfg, s), 3)
    labels = [s.label() for *_x, s in rounds]
    assert labels[:3] == ["sync"] * 3 and labels[3] == "local H=4" and "local H=16 int8" in labels
    # 3 sync rounds (72 samples) + 8 rounds of H=4 (96 each) reach 768 samples at round 11.
    assert labels[11:14] == ["local H=16 int8"] * 3 and labels[14:] == ["sync"] * (len(labels) - 14)


def test_schedule_validation():
    for sched in ([{"mode": "sync"}], [{"at_round": 1, "at_useful_tokens": 5}],
                  [{"at_round": 4}, {"at_round": 2}]):
        with pytest.raises(SettingError):
            check_schedule(load_config({"train": {"mode": "scripted", "settings_schedule": sched}}))
    with pytest.raises(SettingError):
        check_schedule(load_config({"train": {"mode": "scripted"}}))


def test_recovery_epochs_take_their_boundarys_setting():
    cfg = load_config(SCRIPT)
    # A failure in the round that switches (round 2, before the change at round 3): the recovery
    # epoch resuming at round 2 is still sync; one resuming at 3 is H=4 whatever is current.
    assert setting_for_epoch(cfg, L4, 2, 48) == SYNC
    assert setting_for_epoch(cfg, SYNC, 3, 72) == L4
    assert due_change(cfg, SYNC, (3, 72), None)[0] == L4
    assert due_change(cfg, L4, (3, 72), None) is None
    fixed = load_config({"train": {"mode": "local", "inner_steps_h": 4}})
    assert setting_for_epoch(fixed, SYNC, 7, 0) == L4 and due_change(fixed, SYNC, (7, 0), None) is None


def test_epoch_settings_start_steps_across_a_switch_and_a_store_restore():
    cfg = load_config(SCRIPT)
    es = EpochSettings(cfg)
    e1 = es.plan_epoch(1, 0, -1, SYNC)
    assert (e1.start_step, e1.prev_mode) == (0, "sync")
    for r in range(2):  # rounds 0, 1 commit (sync: 1 step each)
        es.on_commit(f"e1r{r}", r + 1)
    # Round 2 in flight; a switch at the next boundary (round 3): 3 steps before it.
    e2 = es.plan_epoch(2, 3, 1, L4)
    assert (e2.start_step, e2.prev_mode) == (3, "sync")
    es.on_commit("e1r2", 3)
    es.on_commit("e2r3", 7)
    # Round 4 aborted by a failure: the recovery epoch resumes at round 4 after step 7.
    e3 = es.plan_epoch(3, 4, 3, L4)
    assert (e3.start_step, e3.prev_mode) == (7, "local")
    es.on_commit("e3r4", 11)
    # Restore from the store at the frontier of round 2 (commit e1r2): back to step 3, sync before.
    es.on_store_restore("e1r2")
    e4 = es.plan_epoch(4, 3, 2, L4)
    assert (e4.start_step, e4.prev_mode) == (3, "sync")
    # Journal replay rebuilds the same epochs.
    es2 = EpochSettings(cfg)
    for ep, rec in ((1, e1), (2, e2), (3, e3), (4, e4)):
        es2.replay_epoch(ep, rec.setting, rec.start_step, rec.prev_mode, rec.start_round)
    assert es2.epochs == es.epochs and es2.current == L4


def test_a_label_reads_back_as_its_setting_and_a_malformed_one_is_refused():
    import pytest

    from ground.setting import ConsistencySetting, SettingError

    for s in (ConsistencySetting("sync", 1), ConsistencySetting("sync", 1, "int8"), ConsistencySetting("local", 4),
              ConsistencySetting("local", 16, "fp16")):
        assert ConsistencySetting.from_label(s.label()) == s
    for bad in ("", "local", "local H=x", "H=4", "local H=4 zip"):
        with pytest.raises(SettingError, match="is not a setting's label"):
            ConsistencySetting.from_label(bad)
