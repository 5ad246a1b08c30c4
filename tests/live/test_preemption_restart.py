"""Preemption with notice under `restart`: the site announces it, the survivors' leader makes the
committed state durable before they wait, and everyone later resumes from exactly that frontier."""

from __future__ import annotations

from chaos.scenario import Scenario
from tests.conftest import assert_ledger_balanced, events
from chaos.policy_config import config_for_policy as _with_policy
from ground.config import load_config, merge
from cluster.launcher import launch

ROUND = 12_288
CFG = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 8 * ROUND,
              "eval_every_rounds": 4, "checkpoint_every_rounds": 100, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 2000},
    "recovery": {"policy": "restart"},
}
SCENARIO = Scenario.build("preempt-b", "b is preempted with a 3 s notice after round 2 and returns").preempt(
    "b", grace_s=3, return_after_s=3, at_useful_tokens=3 * ROUND)


def test_preemption_under_restart_checkpoints_first_and_resumes_from_that_frontier(tmp_path):
    cfg = _with_policy(load_config(merge(CFG, {"runs_dir": str(tmp_path)})), "restart", SCENARIO)
    run_dir, s = launch(cfg, quiet=True, timeout_s=600, scenario=SCENARIO)
    assert s["useful_tokens"] == 8 * ROUND
    assert_ledger_balanced(run_dir, s)  # site logs against the commit record
    coord = events(run_dir, "coord")
    notice = [e for e in coord if e["event"] == "preemption_notice"]
    assert notice and notice[0]["site"] == "b" and notice[0]["checkpoint_first"] is True
    assert [e for e in events(run_dir, "b") if e["event"] == "preemption_announced"]
    # Only the checkpoint-first write and the final one: checkpoint_every_rounds is 100.
    writes = [e for e in events(run_dir, "a") if e["event"] == "checkpoint_write" and "error" not in e]
    assert len(writes) == 2, writes
    first = writes[0]
    restore = [e for e in coord if e["event"] == "membership_epoch" and e["restore"] == "store"]
    assert restore and restore[0]["manifest_hash"] == first["manifest_hash"]
    assert restore[0]["start_cursor"] == first["cursor"]
    # Every site checked what it loaded against the commit record of the frontier's round, not only
    # against the manifest's own hash (issue 54).
    committed = {e["round"]: e["param_hash"] for e in coord if e["event"] == "commit"}
    for site in ("a", "b", "c"):
        spans = [e for e in events(run_dir, site) if e["event"] == "restore" and e.get("kind") == "store"]
        assert spans and spans[-1]["committed_params_hash"] == committed[first["round"]] == spans[-1]["params_hash"]
