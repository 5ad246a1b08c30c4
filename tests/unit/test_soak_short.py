"""The soak's generator keeps its promises (every kind, every trigger kind, overlaps, durations on both
sides of the config's detection thresholds; every trigger within the run). The short soak itself:
tests/live/test_soak_short.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.soak import ALL_KINDS, N_FAULTS, Thresholds, random_schedule, soak_config
from chaos.reach import check_scenario_fits

SEEDS = range(1000, 1020)  # the seeds `make soak` draws
TH = Thresholds(heartbeat_s=2.0, stall_s=8.0)


def _threshold(fault: Any, th: Thresholds) -> float:
    t = fault.target
    if fault.kind.startswith("link_") and "<->" in t and "coord" not in t:
        return th.stall_s
    return th.heartbeat_s


def test_schedules_are_reproducible_and_cover_every_kind_and_trigger() -> None:
    assert random_schedule(7) == random_schedule(7)
    schedules = [random_schedule(s, th=TH) for s in SEEDS]
    kinds = Counter(f.kind for sc in schedules for f in sc.faults)
    assert set(kinds) == set(ALL_KINDS), kinds
    for sc in schedules:
        assert len(sc.faults) == N_FAULTS and len({f.kind for f in sc.faults}) == N_FAULTS
        assert Counter(f.trigger.key for f in sc.faults) == {"at_s": 1, "at_step": 1, "at_useful_tokens": N_FAULTS - 2}
        sites = [f.target for f in sc.faults if f.kind.startswith("site_")]
        assert len(sites) == len(set(sites)), "two process faults on one site could collide"


def test_faults_overlap_and_durations_straddle_the_configs_thresholds() -> None:
    for th in (TH, Thresholds(heartbeat_s=0.5, stall_s=3.0)):  # the thresholds come from the config
        sides: Counter[str] = Counter()
        for seed in SEEDS:
            sc = random_schedule(seed, th=th)
            points = Counter(f.trigger.value for f in sc.faults if f.trigger.by_progress
                             and f.trigger.key == "at_useful_tokens")
            steps = {f.trigger.value * 12_288 // 4 for f in sc.faults if f.trigger.key == "at_step"}
            assert max(points.values()) >= 2 or steps & set(points), f"seed {seed}: no two faults share a point"
            for f in sc.faults:
                if f.kind == "site_restart":
                    continue
                t = _threshold(f, th)
                d = f.duration_s - (f.params["grace_s"] if f.kind == "site_preempt" else 0)
                side = "above" if "above" in f.note else "below"
                assert (d > t) if side == "above" else (d < t), (seed, f)
                sides[f"{f.kind}:{side}"] += 1
        for kind in set(ALL_KINDS) - {"site_restart"}:
            assert sides[f"{kind}:below"] and sides[f"{kind}:above"], (kind, sides)


def test_every_wall_time_trigger_comes_before_the_shortest_possible_run_ends() -> None:
    """The step floor bounds a soak run's length from below on any host; every `at_s` lies inside it
    (a fast host once finished a run before its wall-time crash, which then failed to inject)."""
    from bench.soak import ROUNDS, STEP_FLOOR_MS, STEPS_PER_ROUND, WALL_WINDOW_S

    shortest_s = ROUNDS * STEPS_PER_ROUND * STEP_FLOOR_MS / 1000
    assert WALL_WINDOW_S[1] < shortest_s
    for seed in SEEDS:
        walls = [f.trigger.value for f in random_schedule(seed, th=TH).faults if f.trigger.key == "at_s"]
        assert walls and all(WALL_WINDOW_S[0] <= w <= WALL_WINDOW_S[1] for w in walls), (seed, walls)


def test_every_progress_trigger_lies_within_the_soak_run(tmp_path: Path) -> None:
    cfg = soak_config(tmp_path)
    for seed in SEEDS:
        assert check_scenario_fits(cfg, random_schedule(seed, th=Thresholds.of(cfg))) == []
