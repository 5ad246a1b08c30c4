"""A chaos restart handed to the launcher's warm standby (recovery.warm_standby), on a real cluster.

Real processes, real Toxiproxy, a real SIGKILL: b is killed after round 3 commits and restarted
2 s later. The launcher had started a standby site process at the start of the run; the restart
names it b (one line on its stdin), it joins as a cold process would, and the run ends with a
balanced ledger. The standby that replaces it is stopped at the end, leaving no process behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import Scenario
from ground.config import load_config, merge
from tests.conftest import events, pid_alive
from cluster.launcher import launch

ROUND = 12_288
CFG = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 10 * ROUND,
              "eval_every_rounds": 5, "checkpoint_every_rounds": 4, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 3000},
    "recovery": {"policy": "elastic", "warm_standby": True},
}
SCENARIO = Scenario.build("standby-crash", "b killed after round 3, restarted 2 s later").crash(
    "b", at_useful_tokens=3 * ROUND, restart_after_s=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    cfg = load_config(merge(CFG, {"runs_dir": str(tmp_path_factory.mktemp("standby"))}))
    return launch(cfg, quiet=True, timeout_s=600, scenario=SCENARIO)


def test_a_restarted_site_is_the_warm_standby_and_rejoins(run):
    run_dir, s = run
    assert s["clean_exit"], s["exit_codes"]
    assert s["work_balanced"] and s["useful_tokens"] == 10 * ROUND
    launcher = events(run_dir, "launcher")
    standbys = [e for e in launcher if e["event"] == "standby_started"]
    b_starts = [e for e in launcher if e["event"] == "process_started" and e.get("name") == "b"]
    assert len(b_starts) == 2, b_starts
    first_standby, restart = standbys[0], b_starts[1]
    assert restart.get("warm_standby") is True
    assert restart["child_pid"] == first_standby["child_pid"]  # the standby became b
    healed = [e for e in events(run_dir, "chaos") if e["event"] == "fault_healed"][0]
    assert healed["result"]["restarted"] and healed["result"]["pid"] == restart["child_pid"]
    started = [e for e in events(run_dir, "b") if e["event"] == "site_started"]
    assert len(started) == 2 and started[0].get("warm_standby") is None
    warm = started[1]["warm_standby"]
    assert warm["prepare_s"] > 0 and warm["assigned_mono_ns"] >= warm["ready_mono_ns"]
    assert started[1]["pid"] == restart["child_pid"]
    coord = events(run_dir, "coord")
    joined = [e for e in coord if e["event"] == "site_joined" and e["site"] == "b" and e["mono_ns"] > restart["mono_ns"]]
    assert joined, "the standby never joined as b"
    assert [e for e in coord if e["event"] == "commit" and "b" in e["members"] and e["mono_ns"] > joined[0]["mono_ns"]]


def test_no_standby_outlives_the_run(run):
    run_dir, _ = run
    pids = [e["child_pid"] for e in events(run_dir, "launcher") if e["event"] == "standby_started"]
    assert pids and not [p for p in pids if pid_alive(p)], pids
