"""How two runs' recovery decisions compare (sim/decisions.py), on small hand-written histories."""

from __future__ import annotations

import json
from pathlib import Path

from sim.decisions import compare_runs, unjoined_restarts

S = 1_000_000_000  # ns per s


def _epoch(n: int, t_s: float, members: list[str], joiners: list[str] | None = None, restore: str = "none",
           reason: str = "start") -> dict:
    return {"event": "membership_epoch", "mono_ns": int(t_s * S), "epoch": n, "members": members,
            "restore": restore, "donor": None, "joiners": joiners or [], "start_round": n, "start_cursor": 0,
            "reason": reason}


def _run(root: Path, name: str, coord: list[dict], chaos: list[dict]) -> Path:
    d = root / name
    (d / "logs").mkdir(parents=True)
    for proc, evs in (("coord", coord), ("chaos", chaos)):
        (d / "logs" / f"{proc}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
    return d


KILL = [{"event": "fault_injected", "mono_ns": 5 * S, "kind": "site_crash", "target": "b"},
        {"event": "fault_healed", "mono_ns": 7 * S, "kind": "site_crash", "target": "b", "result": {"restarted": True}}]
FIRST_TWO = [_epoch(1, 0, ["a", "b", "c"]),
             {"event": "site_failed", "mono_ns": 6 * S, "site": "b", "reason": "connection closed"},
             _epoch(2, 6, ["a", "c"], reason="b failed")]
REJOIN = _epoch(3, 12, ["a", "b", "c"], joiners=["b"], restore="donor", reason="b joined")


def test_an_emulated_run_that_ended_before_the_restarted_site_joined_is_a_prefix_of_the_simulated_one(tmp_path):
    emu = _run(tmp_path, "emu", FIRST_TWO + [{"event": "run_finished", "mono_ns": 10 * S}], KILL)
    sim = _run(tmp_path, "sim", FIRST_TWO + [REJOIN], KILL)
    assert unjoined_restarts(emu) == {"b": 3.0}
    c = compare_runs(emu, sim, "oracle")
    assert (c.status, c.compared, c.structural_mismatches) == ("prefix match", 2, [])
    assert c.disturbed_by == ("the emulator's run ended, or made its last commit, before b joined again "
                              "(3.0 s after its restart)")


def test_an_extra_simulated_decision_that_is_not_the_late_sites_return_is_a_mismatch(tmp_path):
    emu = _run(tmp_path, "emu", FIRST_TWO, KILL)
    other = _epoch(3, 12, ["a"], reason="c failed")
    sim = _run(tmp_path, "sim", FIRST_TWO + [other], KILL)
    c = compare_runs(emu, sim, "elastic")
    assert c.status == "mismatch"
    assert c.structural_mismatches == ["2 emulator decisions, 3 simulated"]


def test_an_extra_simulated_decision_when_the_site_did_join_in_the_emulator_is_a_mismatch(tmp_path):
    joined = {"event": "site_joined", "mono_ns": 9 * S, "site": "b"}
    emu = _run(tmp_path, "emu", FIRST_TWO + [joined], KILL)
    sim = _run(tmp_path, "sim", FIRST_TWO + [REJOIN], KILL)
    assert unjoined_restarts(emu) == {}
    assert compare_runs(emu, sim, "elastic").status == "mismatch"


def test_the_same_decisions_match(tmp_path):
    emu = _run(tmp_path, "emu", FIRST_TWO + [REJOIN], KILL)
    sim = _run(tmp_path, "sim", FIRST_TWO + [REJOIN], KILL)
    c = compare_runs(emu, sim, "restart")
    assert (c.status, c.compared, c.disturbed_by) == ("match", 3, None)


def test_a_simulated_run_that_ended_before_the_restarted_site_joined_is_a_prefix_of_the_emulated_one(tmp_path):
    """The mirror case: the simulated run reached its target before its (fitted, median) restart
    brought b back, while the emulator's b joined in time. The emulator's last decision only adds b
    back; it is beyond what the simulated run showed, not against it."""
    emu = _run(tmp_path, "emu", FIRST_TWO + [REJOIN], KILL)
    sim = _run(tmp_path, "sim", FIRST_TWO + [{"event": "run_finished", "mono_ns": 11 * S}], KILL)
    c = compare_runs(emu, sim, "oracle")
    assert (c.status, c.compared, c.emulator_decisions, c.simulator_decisions) == ("prefix match", 2, 3, 2)
    assert c.structural_mismatches == []
    assert c.disturbed_by == ("the simulated run ended, or made its last commit, before b joined again "
                              "(4.0 s after its restart)")


def test_a_missing_simulated_decision_that_is_not_the_late_sites_return_is_a_mismatch(tmp_path):
    other = _epoch(3, 12, ["a"], reason="c failed")
    emu = _run(tmp_path, "emu", FIRST_TWO + [other], KILL)
    sim = _run(tmp_path, "sim", FIRST_TWO + [{"event": "run_finished", "mono_ns": 11 * S}], KILL)
    c = compare_runs(emu, sim, "elastic")
    assert c.status == "mismatch"
    assert c.structural_mismatches == ["3 emulator decisions, 2 simulated"]


def test_a_simulated_run_whose_restarted_site_joined_after_its_last_commit_is_a_prefix(tmp_path):
    """The simulated b joined again, but after the run's last commit: no round was left to admit it,
    so the emulator's decision that adds b back is beyond what the simulated run could show. A join
    before the last commit with no decision after it stays a mismatch."""
    commit = {"event": "commit", "mono_ns": 10 * S, "round": 9}
    emu = _run(tmp_path, "emu", FIRST_TWO + [REJOIN], KILL)
    joined_late = {"event": "site_joined", "mono_ns": int(10.5 * S), "site": "b"}
    late = _run(tmp_path, "late", FIRST_TWO + [commit, joined_late], KILL)
    c = compare_runs(emu, late, "elastic")
    assert (c.status, c.compared, c.structural_mismatches) == ("prefix match", 2, [])
    assert c.disturbed_by == "the simulated run ended, or made its last commit, before b joined again (3.0 s after its " \
                             "restart)"
    joined_early = {"event": "site_joined", "mono_ns": int(9.5 * S), "site": "b"}
    early = _run(tmp_path, "early", FIRST_TWO + [joined_early, commit], KILL)
    assert compare_runs(emu, early, "elastic").structural_mismatches == ["3 emulator decisions, 2 simulated"]


def test_a_simulated_run_told_that_its_rejoin_came_with_the_last_round_in_flight_is_a_prefix(tmp_path):
    """The simulated b joined again before the last commit, but while the last round was in flight:
    the coordinator said it could not admit it any more (coordinator/recovery.py) and never did, so
    the emulator's decision that adds b back (its b came a round earlier, on a slower host) is beyond
    what the simulated run could show. Told nothing, it stays a mismatch; so does a later epoch that
    differs from the emulator's."""
    emu = _run(tmp_path, "emu", FIRST_TWO + [REJOIN], KILL)
    joined = {"event": "site_joined", "mono_ns": int(9.5 * S), "site": "b"}
    told = {"event": "recovery_decision", "mono_ns": int(9.5 * S),
            "reason": "oracle: ['b'] wait: the run ends with the round in flight"}
    commit = {"event": "commit", "mono_ns": 10 * S, "round": 9}
    late = _run(tmp_path, "late", FIRST_TWO + [joined, told, commit], KILL)
    c = compare_runs(emu, late, "oracle")
    assert (c.status, c.compared, c.structural_mismatches) == ("prefix match", 2, [])
    assert c.disturbed_by == ("the simulated run ended, or made its last commit, before b joined again "
                              "(3.0 s after its restart)")
    other = _run(tmp_path, "other", FIRST_TWO + [joined, told, _epoch(3, 9.8, ["a", "c"]), commit], KILL)
    assert compare_runs(emu, other, "oracle").status == "mismatch"  # an epoch without b: a real difference
    untold = _run(tmp_path, "untold", FIRST_TWO + [joined, commit], KILL)
    assert compare_runs(emu, untold, "oracle").structural_mismatches == ["3 emulator decisions, 2 simulated"]
