"""The simulator's warm standby (sim/standby.py) follows the launcher's rules: one prepared process,
a restart handed to it joins at once (or when its preparation ends), the next one starts
STANDBY_NEXT_AFTER_S later, and a restart that finds none starts cold; calibration tells the two
kinds of restart apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.scenario import Scenario
from ground.config import STANDBY_NEXT_AFTER_S, load_config, merge
from ground.eventlog import process_events
from sim.calibrate import samples_of
from sim.engine import ns
from sim.model import SimModel
from sim.standby import StandbyPool
from sim.world import simulate
from tests.conftest import COMPARE_CFG

MODEL = SimModel(restart_s=9.0, standby_prepare_s=8.0, standby_restart_s=0.15)


def test_a_restart_takes_the_prepared_standby_and_the_next_one_starts_ten_seconds_later() -> None:
    pool = StandbyPool(enabled=True, started_ns=0)
    assert pool.restart(ns(20), MODEL) == (pytest.approx(0.15), True)
    # 5 s later the next standby is not started yet (due at 30 s): cold, and replaced at once
    assert STANDBY_NEXT_AFTER_S == 10.0
    assert pool.restart(ns(25), MODEL) == (9.0, False)
    # the replacement started at 25 s is still preparing at 30 s: the restart waits for it (ready at 33 s)
    assert pool.restart(ns(30), MODEL) == (pytest.approx(3.15), True)
    # the next one was due at 40 s and is prepared by 50 s
    assert pool.restart(ns(50), MODEL) == (pytest.approx(0.15), True)


def test_a_restart_during_the_first_standbys_preparation_waits_for_it() -> None:
    pool = StandbyPool(enabled=True, started_ns=0)
    assert pool.restart(ns(3), MODEL) == (pytest.approx(5.15), True)


def test_without_the_option_every_restart_is_cold() -> None:
    pool = StandbyPool(enabled=False)
    assert [pool.restart(ns(t), MODEL) for t in (20, 25, 60)] == [(9.0, False)] * 3


@pytest.mark.parametrize("over, scenario, enabled", [
    ({"recovery": {"warm_standby": True}}, True, True),
    ({"recovery": {"warm_standby": True}}, False, False),  # only chaos restarts use one
    ({"recovery": {"warm_standby": True}, "train": {"workers_per_site": 2}}, True, False),
    ({}, True, False),
])
def test_the_pool_exists_exactly_when_the_launcher_would_keep_one(over: dict, scenario: bool, enabled: bool) -> None:
    assert StandbyPool.for_run(load_config(merge(COMPARE_CFG, over)), scenario).enabled is enabled


def _restart_to_join_s(run: Path) -> tuple[float, dict]:
    healed = next(e for e in process_events(run, "chaos") if e["event"] == "fault_healed")
    joined = next(e for e in process_events(run, "coord")
                  if e["event"] == "site_joined" and e["site"] == "b" and e["mono_ns"] >= healed["mono_ns"])
    return (joined["mono_ns"] - healed["mono_ns"]) / 1e9, healed["result"]


def test_a_simulated_crash_restarts_through_the_standby_and_calibration_fits_it_apart(tmp_path: Path) -> None:
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    runs = {}
    for name, warm in (("cold", False), ("warm", True)):
        cfg = load_config(merge(COMPARE_CFG, {"run_id": f"sim-{name}", "recovery": {"policy": "elastic",
                                                                                     "warm_standby": warm}}))
        res = simulate(cfg, scen, MODEL, out=tmp_path / name)
        assert res.complete
        runs[name] = _restart_to_join_s(tmp_path / name)
    latency_s = 0.2  # the join's trip to the coordinator is at most the service link's latency here
    cold_s, cold_result = runs["cold"]
    warm_s, warm_result = runs["warm"]
    assert 9.0 <= cold_s <= 9.0 + latency_s and "warm_standby" not in cold_result
    assert 0.15 <= warm_s <= 0.15 + latency_s and warm_result["warm_standby"] is True
    est = samples_of(tmp_path / "warm")
    assert est["restart_s"] == [] and len(est["standby_restart_s"]) == 1
    assert est["standby_restart_s"][0] == pytest.approx(warm_s)
    assert json.loads((tmp_path / "warm" / "config.json").read_text())["recovery"]["warm_standby"] is True
