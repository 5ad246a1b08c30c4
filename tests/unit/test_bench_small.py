"""The small version of bench/sim_scale.py: the simulator reaches its simulated time through the
coordinator's core. The small benchmarks that start real parts: tests/live/test_bench_small.py."""

from __future__ import annotations



def test_sim_scale_small_reaches_its_simulated_time_through_the_core() -> None:
    from bench.sim_scale import run

    raw = run(30, 120.0, 0.0)
    assert raw["sim_s_reached"] >= 100, raw
    assert raw["commits"] > 10 and raw["events"] > 1000 and raw["useful_tokens"] > 0
    # Every decision went through the coordinator core, timed per message kind.
    assert {"heartbeat", "round_done"} <= set(raw["core_by_kind"]), raw["core_by_kind"].keys()
    assert raw["core_steps"] > 0 and 0 < raw["core_s"] < raw["wall_s"]
