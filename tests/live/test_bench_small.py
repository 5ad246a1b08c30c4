"""Small versions of benchmarks that had none in the suite (`make bench` runs the full ones).

Each runs the benchmark's own code, shrunk (fewer sizes, rounds or sites), against the real parts
it measures (toxiproxy-server, CURVE WanNodes, torch, the simulator), writes its result into a
temporary results directory (never bench/results/), and asserts what must hold at any size: the
result is written in the table's format, shaping is on (nothing beats its configured bandwidth),
the collective's sites reject nothing, the simulator reaches its simulated time. A benchmark whose
code rots fails here, not at the next `make bench` (as analysis_speed once did, unnoticed).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.common
from bench.common import MiB


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    out = tmp_path / "results"
    monkeypatch.setattr(bench.common, "RESULTS", out)
    return out


def _written(results: Path, name: str) -> dict:
    doc = json.loads((results / f"{name}.json").read_text())
    assert {"ratio", "goal", "passed", "reference", "measures", "raw", "env", "notes"} <= set(doc), doc.keys()
    assert doc["measures"] and doc["env"].get("git_commit")
    return doc


@pytest.mark.integration
def test_wan_fidelity_small_never_beats_the_configured_bandwidth(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.wan_fidelity as b

    monkeypatch.setattr(b, "SIZES", [1 * MiB, 2 * MiB])
    monkeypatch.setattr(b, "DEFAULT_REPS", 1)
    b.run()
    doc = _written(results, "wan_fidelity")
    # Under 0.95 the payload crossed faster than L + S/B allows: shaping would be off. A loaded
    # machine can only make it slower, so the upper side is a sanity bound, not the goal.
    assert 0.95 <= doc["ratio"] < 3.0, doc["ratio"]


@pytest.mark.integration
def test_collective_efficiency_small_is_bounded_by_the_links(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.collective_efficiency as b

    monkeypatch.setattr(b, "REPS", 1)
    b.run()
    doc = _written(results, "collective_efficiency")
    assert 0.95 <= doc["ratio"] < 3.0, doc["ratio"]  # the all-reduce cannot beat 2(n-1)/n * P / B


@pytest.mark.integration
def test_emulator_overhead_small_runs_the_agents_round_path(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.emulator_overhead as b

    monkeypatch.setattr(b, "ROUNDS", 2)
    b.run()
    doc = _written(results, "emulator_overhead")
    raw = doc["raw"]
    assert raw["rounds_counted"] == 2 and len(raw["round_ratios"]) == 2
    assert raw["median_allreduce_s"] > 0 and raw["median_snapshot_s"] > 0
    # The three sites' reducers validated every part and rejected none.
    assert all(s["rejected"] == 0 for s in raw["node_stats"]["after_start"].values()), raw["node_stats"]
    assert 0 < doc["ratio"] <= 1.5, doc["ratio"]


@pytest.mark.integration
def test_cluster_throughput_small_measures_both_arms_side_by_side(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pair (S C S) of 3-round runs: the real cluster through Toxiproxy and the one-process
    reference, alternated as in the full bench; the ratio is each arm's own measurement."""
    import bench.cluster_throughput as b

    monkeypatch.setattr(b, "ROUNDS", 3)
    monkeypatch.setattr(b, "PAIRS", 1)
    b.run()
    doc = _written(results, "cluster_throughput")
    raw = doc["raw"]
    assert raw["rounds"] == 3 and len(raw["singles"]) == 2 and len(raw["clusters"]) == 1
    assert all(t > 0 for t in raw["cluster_tokens_per_s"] + raw["single_tokens_per_s"]), raw
    c = raw["cluster_tokens_per_s"][0] / (sum(raw["single_tokens_per_s"]) / 2)
    assert doc["ratio"] == pytest.approx(c) and 0 < doc["ratio"] < 5, doc["ratio"]
    # A busy machine cannot pass, whatever the ratio (the bench's own rule).
    assert not (raw["busy"] and doc["passed"])


@pytest.mark.integration
def test_recovery_small_measures_a_failover_and_a_rejoin_in_each_arm(results: Path) -> None:
    """One run per arm (a cold restart, the warm standby): site b SIGKILLed after round 3 and
    restarted; both figures are measured from the logs, and two runs cannot claim a p90."""
    import bench.recovery as b

    assert b.main(["--repeats", "1"]) == 1  # fewer than MIN_REPEATS runs: not a pass, whatever the times
    fo, rj = _written(results, "recovery_failover"), _written(results, "recovery_rejoin")
    assert fo["raw"]["runs"] == 2 and not fo["raw"]["unmeasured_runs"], fo["raw"]
    assert not fo["passed"] and not rj["passed"]
    samples = fo["raw"]["samples"]
    assert sorted(bool(m["warm_standby"]) for m in samples) == [False, True]
    for m in samples:
        # The kill comes first, then b is failed (by its closed connection or the heartbeat
        # timeout), then the survivors commit without it; the restarted b commits after its restart.
        assert 0 < m["kill_to_failed_s"] <= m["kill_to_survivor_commit_s"], m
        assert m["failed_by"] in ("connection_lost", "heartbeat"), m
        assert m["restart_to_first_commit_s"] > 0 and m["useful_tokens"] >= b.TARGET_ROUNDS * b.ROUND, m


@pytest.mark.integration
def test_cluster_startup_small_measures_both_arms_start_up_and_rejoin(results: Path) -> None:
    """One run per arm (cold sites, sites forked from the fork server): start-up and b's rejoin are
    measured from the logs in both, the forked one started its sites from the server, and two runs
    cannot claim a p90."""
    import bench.cluster_startup as b

    assert b.main(["--repeats", "1"]) == 1  # fewer than MIN_REPEATS runs per arm: not a pass
    up, rj = _written(results, "cluster_startup"), _written(results, "cluster_rejoin_forked")
    assert not up["passed"] and not rj["passed"]
    samples = up["raw"]["samples"]
    assert [m["arm"] for m in samples] == ["cold", "forked"] and [m["forkserver"] for m in samples] == [False, True]
    for m in samples:
        assert m["clean_exit"], m
        assert 0 < m["run_started_to_sites_started_s"] < m["run_started_to_first_commit_s"], m
        assert 0 <= m["restart_to_site_started_s"] < m["restart_to_first_commit_s"], m
        assert all(m["peak_rss_mib"][p] > 10 for p in ("a", "c", "coord", "store")), m  # each reported its peak


@pytest.mark.integration
def test_adaptive_collapse_small_runs_its_three_arms_to_the_target(results: Path) -> None:
    """sync, fixed H=16 and adaptive on the scaled bandwidth collapse at two fixed-H rounds' worth
    of tokens: every arm reaches the target and logs a final NLL, so the ratios are computed from
    measured times (the goals are for the full size; here only that they are measured)."""
    import bench.adaptive_collapse as b

    # Two rounds of the fixed arm: H x 3 sites x its per-site batch x 128 tokens (49,152).
    target = 2 * b.FIXED_H * 3 * b.BASE["train"]["per_site_batch"] * 128
    b.main(["--target-tokens", str(target)])
    doc = _written(results, "adaptive_collapse")
    arms = doc["raw"]["arms"]
    assert set(arms) == {"sync", "fixed", "adaptive"}
    for name, arm in arms.items():
        assert arm["clean_exit"] and arm["useful_tokens"] >= target, (name, arm)
        assert arm["time_to_target_s"] > 0 and arm["final_heldout_nll"] > 0, (name, arm)
    t = {a: arms[a]["time_to_target_s"] for a in arms}
    assert doc["ratio"] == pytest.approx(t["adaptive"] / t["fixed"])
    assert doc["raw"]["sync_over_adaptive_time"] == pytest.approx(t["sync"] / t["adaptive"])
