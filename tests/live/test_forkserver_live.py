"""Site processes forked from the launcher's fork server (cluster.fork_server), on a real cluster.

Real processes, real Toxiproxy, real training, a real SIGKILL: the three sites are forked from one
server that imported torch and the site code once; b is killed after round 3 commits and restarted
2 s later, forked again. The run ends balanced at its target, the restarted b joins and commits, the
forked sites start without paying the torch import, and nothing the launcher started outlives it.
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
    "cluster": {"fork_server": True},
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 10 * ROUND,
              "eval_every_rounds": 5, "checkpoint_every_rounds": 4, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 3000},
    "recovery": {"policy": "elastic"},
}
SCENARIO = Scenario.build("forked-crash", "b killed after round 3, restarted 2 s later").crash(
    "b", at_useful_tokens=3 * ROUND, restart_after_s=2)
FORKED_START_S = 2.0  # fork -> site_started; a cold `python -m site_agent.agent` pays 4-9 s here


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    cfg = load_config(merge(CFG, {"runs_dir": str(tmp_path_factory.mktemp("forked"))}))
    return launch(cfg, quiet=True, timeout_s=600, scenario=SCENARIO)


def test_forked_sites_train_and_a_forked_restart_rejoins(run):
    run_dir, s = run
    assert s["clean_exit"], s["exit_codes"]
    assert s["work_balanced"] and s["useful_tokens"] == 10 * ROUND
    launcher = events(run_dir, "launcher")
    starts = {n: [e for e in launcher if e["event"] == "process_started" and e.get("name") == n] for n in "abc"}
    assert all(e.get("forked") is True for n in "abc" for e in starts[n]), starts
    assert len(starts["b"]) == 2
    restart = starts["b"][1]
    healed = [e for e in events(run_dir, "chaos") if e["event"] == "fault_healed"][0]
    assert healed["result"]["restarted"] and healed["result"]["pid"] == restart["child_pid"]
    b_started = [e for e in events(run_dir, "b") if e["event"] == "site_started"]
    assert len(b_started) == 2 and b_started[1]["pid"] == restart["child_pid"]
    took_s = (b_started[1]["mono_ns"] - restart["mono_ns"]) / 1e9
    assert 0 <= took_s < FORKED_START_S, f"a forked restart took {took_s:.2f} s to start"
    coord = events(run_dir, "coord")
    joined = [e for e in coord if e["event"] == "site_joined" and e["site"] == "b" and e["mono_ns"] > restart["mono_ns"]]
    assert joined, "the forked b never joined"
    assert [e for e in coord if e["event"] == "commit" and "b" in e["members"] and e["mono_ns"] > joined[0]["mono_ns"]]


def test_a_donor_logs_its_counters_once_the_state_it_sent_left_the_process(run):
    """A donor killed before its next round's snapshot must still account for the state it sent
    (issue 54): the counters it logs right after `state_sent` hold at least that many state bytes."""
    run_dir, _ = run
    donors = [(site, e) for site in ("a", "c") for e in events(run_dir, site) if e["event"] == "state_sent"]
    assert donors, "nobody sent b its state"
    site, sent = donors[0]
    after = [e for e in events(run_dir, site) if e["event"] == "wan_counters" and e["mono_ns"] >= sent["mono_ns"]]
    links = {f"{site}_to_b", f"b_to_{site}"}  # the link between the donor and b, either end its client
    state_tx = sum(r["bytes"] for r in after[0]["counters"]
                   if r["side"] == "tx" and r["cls"] == "state_transfer" and r["link"] in links)
    assert state_tx >= sent["bytes"], (after[0], sent)


def test_nothing_forked_outlives_the_run(run):
    run_dir, _ = run
    launcher = events(run_dir, "launcher")
    pids = [e["child_pid"] for e in launcher if e["event"] == "process_started"
            and (e.get("forked") or e.get("name") == "forkserver")]
    assert len(pids) == 5 and not [p for p in pids if pid_alive(p)], pids
