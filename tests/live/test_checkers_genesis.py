"""A restart before the first durable checkpoint: everyone starts over from the initial weights.

One real run (real processes, the real Toxiproxy): under `restart`, site b is SIGKILLed right after
round 0 commits and restarted 2 s later; the first checkpoint would come after round 3, so nothing
is durable and the coordinator plans `restore: store` with no manifest. Every member logs a restore
from the initial weights, and the first commit after it has no parent. `lineage` and
`no_fresh_overwrite` must accept exactly that (they did not: 24 "work_attempted before loading the
cluster's state"), and reject copies of the same logs where the genesis is not what the plan and
the restore events say.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.artifact import build_artifact
from tests.conftest import COMPARE_CFG

MANIFESTS = ("config.json", "topology.json", "scenario.json")


@pytest.fixture(scope="module")
def genesis_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from chaos.scenario import Scenario
    from ground.config import load_config, merge
    from cluster.launcher import launch

    scenario = Scenario.build("test-genesis", "b is killed after round 0 commits, before the first durable "
                              "checkpoint, and restarted 2 s later").crash("b", at_useful_tokens=12_288,
                                                                           restart_after_s=2)
    out = tmp_path_factory.mktemp("genesis")
    cfg = load_config(merge(COMPARE_CFG, {"runs_dir": str(out), "recovery": {"policy": "restart"},
                                          "train": {"target_useful_tokens": 49_152, "checkpoint_every_rounds": 4}}))
    run_dir, summary = launch(cfg, quiet=True, timeout_s=600, scenario=scenario)
    assert summary["useful_tokens"] == 49_152, summary
    return Path(run_dir)


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, evs: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


def _copy(run_dir: Path, dest: Path) -> Path:
    (dest / "logs").mkdir(parents=True)
    for name in MANIFESTS:
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, dest / name)
    for p in (run_dir / "logs").glob("*.jsonl"):
        shutil.copy(p, dest / "logs" / p.name)
    return dest


def _checks(run: Path) -> dict[str, dict]:
    return {c["name"]: c for c in build_artifact([run])["checks"]}


def _genesis_epoch(run: Path) -> dict:
    epochs = [e for e in _read(run / "logs" / "coord.jsonl") if e["event"] == "membership_epoch"]
    genesis = [e for e in epochs if e["restore"] == "store" and e["manifest_hash"] is None and e["start_round"] == 0]
    assert genesis, f"the run did not restart from the initial weights: {epochs}"
    return genesis[-1]


def test_a_restart_before_the_first_checkpoint_is_a_verified_genesis_that_every_checker_accepts(genesis_run):
    g = _genesis_epoch(genesis_run)
    coord = _read(genesis_run / "logs" / "coord.jsonl")
    commits = [e for e in coord if e["event"] == "commit"]
    roots = [c for c in commits[1:] if c["parent"] is None]
    assert roots and roots[0]["epoch"] == g["epoch"] and roots[0]["round"] == 0, commits
    for site in g["members"]:
        restores = [e for e in _read(genesis_run / "logs" / f"{site}.jsonl")
                    if e["event"] == "restore" and e["epoch"] == g["epoch"]]
        assert [e.get("source") for e in restores] == ["initial weights"], (site, restores)
    checks = _checks(genesis_run)
    for name in ("lineage", "no_fresh_overwrite", "fencing", "work_ledger", "faults_fired"):
        assert checks[name]["status"] == "pass", checks[name]
    assert any("1 new root(s)" in line for line in checks["lineage"]["evidence"]), checks["lineage"]
    assert any("verified genesis" in line for line in checks["no_fresh_overwrite"]["evidence"])


def test_a_member_that_did_not_restore_the_initial_weights_fails_lineage_and_no_fresh_overwrite(genesis_run, tmp_path):
    run = _copy(genesis_run, tmp_path / "run")
    g = _genesis_epoch(run)
    log = run / "logs" / "b.jsonl"  # b is the freshly restarted process
    evs = _read(log)
    _write(log, [e for e in evs if not (e["event"] == "restore" and e["epoch"] == g["epoch"])])
    checks = _checks(run)
    assert checks["lineage"]["status"] == "fail", checks["lineage"]
    assert any("b logged no restore from the initial weights" in x for x in checks["lineage"]["evidence"])
    assert checks["no_fresh_overwrite"]["status"] == "fail", checks["no_fresh_overwrite"]
    assert any("before loading the cluster's state" in x for x in checks["no_fresh_overwrite"]["evidence"])


def test_initial_weights_restored_under_a_plan_that_names_a_checkpoint_fail(genesis_run, tmp_path):
    run = _copy(genesis_run, tmp_path / "run")
    g = _genesis_epoch(run)
    log = run / "logs" / "coord.jsonl"
    _write(log, [{**e, "manifest_hash": "ab" * 32} if e["id"] == g["id"] else e for e in _read(log)])
    checks = _checks(run)
    assert checks["lineage"]["status"] == "fail", checks["lineage"]
    assert any("restarts everyone from the initial weights" in x for x in checks["lineage"]["evidence"])
    assert checks["no_fresh_overwrite"]["status"] == "fail", checks["no_fresh_overwrite"]
    assert any("restored the initial weights, which is not the cluster's state" in x
               for x in checks["no_fresh_overwrite"]["evidence"]), checks["no_fresh_overwrite"]


def test_a_root_commit_that_is_not_round_zero_fails_lineage(genesis_run, tmp_path):
    run = _copy(genesis_run, tmp_path / "run")
    log = run / "logs" / "coord.jsonl"
    evs = _read(log)
    commits = [e for e in evs if e["event"] == "commit"]
    second = commits[-1]  # a commit deep in the new lineage loses its parent
    _write(log, [{**e, "parent": None} if e["id"] == second["id"] else e for e in evs])
    checks = _checks(run)
    assert checks["lineage"]["status"] == "fail", checks["lineage"]


def test_a_genesis_run_missing_a_members_log_is_unknown_not_pass(genesis_run, tmp_path):
    run = _copy(genesis_run, tmp_path / "run")
    (run / "logs" / "c.jsonl").unlink()
    checks = _checks(run)
    for name in ("lineage", "no_fresh_overwrite", "fencing", "work_ledger", "log_integrity"):
        assert checks[name]["status"] == "unknown", checks[name]
        assert any("no logs/c.jsonl" in x for x in checks[name]["evidence"]), checks[name]
