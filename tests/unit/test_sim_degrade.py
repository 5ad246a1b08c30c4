"""link_degrade's cuts and slicer in the simulator (sim/faults.py), as Toxiproxy applies them in the
emulator: a timeout / reset_peer passes no data and closes the connection after its delay (so the
coordinator fails a site by the lost connection; a timeout of 0, which a scenario spells
link_blackhole, would never close it), and a slicer caps the rate at average_size per delay."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import Scenario
from ground.config import load_config, merge
from ground.eventlog import process_events
from sim.faults import degrade_close_ms, degrade_kbps
from sim.world import simulate
from tests.conftest import COMPARE_CFG


def cfg_for(name: str, **over: object):
    return load_config(merge(merge(COMPARE_CFG, {"run_id": f"sim-{name}", "recovery": {"policy": "elastic"}}), over))


def test_the_rate_cap_is_the_lower_of_bandwidth_and_the_slicers_size_per_delay() -> None:
    assert degrade_kbps({"latency_ms": 50}) == 0  # caps nothing
    assert degrade_kbps({"bandwidth_kbps": 300}) == 300
    sl = {"average_size": 2048, "size_variation": 1024, "delay_us": 500}  # 2,048 B per 0.5 ms = 4,096 KB/s
    assert degrade_kbps({"slicer": sl}) == 4096
    assert degrade_kbps({"slicer": sl, "bandwidth_kbps": 300}) == 300
    assert degrade_kbps({"slicer": {"average_size": 100, "delay_us": 0}}) == 0  # slices, but no delay


def test_a_timeout_closes_after_its_delay_a_zero_timeout_never_and_reset_peer_after_its_own() -> None:
    assert degrade_close_ms({"timeout_ms": 500}) == 500
    assert degrade_close_ms({"timeout_ms": 0}) is None
    assert degrade_close_ms({"reset_peer_ms": 200}) == 200
    assert degrade_close_ms({"timeout_ms": 500, "reset_peer_ms": 200}) == 200
    assert degrade_close_ms({"latency_ms": 5}) is None


def _failed_after_s(run: Path, site: str) -> tuple[float, str]:
    inj = next(e for e in process_events(run, "chaos") if e["event"] == "fault_injected")
    failed = next(e for e in process_events(run, "coord") if e["event"] == "site_failed" and e["site"] == site)
    return (failed["mono_ns"] - inj["mono_ns"]) / 1e9, failed["reason"]


@pytest.mark.parametrize("param, low_s, high_s", [
    ({"timeout_ms": 500}, 0.8, 1.3),  # closed at 0.5 s, failed after the 300 ms grace
    ({"reset_peer_ms": 200}, 0.5, 1.0),  # RST 0.2 s after the first data (heartbeats: at once)
])
def test_a_cutting_toxic_on_a_sites_links_fails_it_by_the_lost_connection(
        tmp_path: Path, param: dict, low_s: float, high_s: float) -> None:
    sc = Scenario.build("t", "").degrade("a", at_s=2.0, duration_s=6.0, **param)
    cfg = cfg_for("cut", wan={"heartbeat_timeout_ms": 2000})
    res = simulate(cfg, sc, out=tmp_path / "run")
    assert res.complete
    after_s, reason = _failed_after_s(tmp_path / "run", "a")
    assert "connection closed" in reason and low_s <= after_s <= high_s, (after_s, reason)
    # the heal releases the link: a comes back and the run completes with it
    joined = [e for e in process_events(tmp_path / "run", "coord") if e["event"] == "site_joined" and e["site"] == "a"]
    assert len(joined) >= 2


def test_a_slicer_slows_the_collective_across_the_sliced_link(tmp_path: Path) -> None:
    times = {}
    for name, params in (("plain", {"latency_ms": 0}),
                         ("sliced", {"slicer": {"average_size": 256, "size_variation": 0, "delay_us": 1000}})):
        sc = Scenario.build("t", "").degrade("a<->b", at_s=0.0, duration_s=3600.0, **params)
        res = simulate(cfg_for(name), sc, out=tmp_path / name)
        assert res.complete
        coll = [e for e in process_events(tmp_path / name, "a") if e["event"] == "collective" and "error" not in e]
        times[name] = sorted((e["end_mono_ns"] - e["start_mono_ns"]) / 1e9 for e in coll)[len(coll) // 2]
    # 256 B per ms = 256 KB/s: a 3-site shard of the 842,496-value model (1.12 MB) takes ~4.4 s per phase
    assert times["sliced"] > times["plain"] + 5.0, times
