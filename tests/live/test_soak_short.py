"""The short soak: one four-fault schedule under two policies, judged as `make soak` judges every
run, and the soak's checks shown to fail on purposely broken copies of a real run.

The full soak is `make soak` (20 schedules of 6 faults, every policy); this file runs the real thing
small enough for the suite. The generator's promises: tests/unit/test_soak_short.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.soak import Thresholds, judge_schedule, random_schedule, soak_config, soak_one
from bench.soak_check import checkpoints, clean_exit, faults_logged, frontier_is_tip, reached_target
from chaos.reach import run_end


# ------------------------------------------------------------------------------- a real soak

SEED, SHORT_FAULTS = 1007, 4  # crash (wall time), hang (step), store outage, blackhole; two share a point
POLICIES = ("restart", "elastic")


@pytest.fixture(scope="module")
def short_soak(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("soak")
    group = [soak_one(SEED, p, root, n_faults=SHORT_FAULTS) for p in POLICIES]
    judge_schedule(group, root / "schedule-analysis")
    return group


def test_short_soak_passes_every_check(short_soak: list[dict[str, Any]]) -> None:
    for r in short_soak:
        assert r["passed"], (r["policy"], r["reasons"], r["run_dir"])
        assert set(r["verdicts"]) >= {"reached_target", "checkers", "clean_exit", "checkpoints", "frontier_is_tip",
                                      "faults_logged", "same_frontier"}
        assert r["checks"] and all(s == "pass" for n, s in r["checks"].items() if n != "same_frontier"), r["checks"]
        assert r["verdicts"]["same_frontier"]["detail"].startswith("pass")


def test_short_soak_faults_fired_and_caused_recoveries(short_soak: list[dict[str, Any]]) -> None:
    for r in short_soak:
        progress = [f for f in r["faults"] if "at_s" not in f]
        assert all(f["fired"] for f in progress), r["faults"]
        assert r["recoveries"].get("site_failed", 0) >= 1, r["recoveries"]  # something was detected and recovered
        assert any(f["recoveries"] for f in r["faults"] if f["fired"])


def _copy(run: dict[str, Any], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    src = Path(run["run_dir"])
    dst = tmp_path / src.name
    shutil.copytree(src, dst, symlinks=True)
    return dst, json.loads((dst / "summary.json").read_text())


def test_a_corrupt_checkpoint_blob_fails_the_run(short_soak: list[dict[str, Any]], tmp_path: Path) -> None:
    run_dir, _ = _copy(short_soak[0], tmp_path)
    blob = next(p for p in (run_dir / "store" / "blobs").rglob("*") if p.is_file())
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    v = checkpoints(run_dir)
    assert not v.ok and "Corrupt" in v.detail, v


def test_a_frontier_behind_the_last_commit_fails_the_run(short_soak: list[dict[str, Any]], tmp_path: Path) -> None:
    run_dir, _ = _copy(short_soak[1], tmp_path)
    coord = run_dir / "logs" / "coord.jsonl"
    last = [json.loads(line) for line in coord.read_text().splitlines() if '"event": "commit"' in line][-1]
    later = {**last, "id": "coord:999999", "commit_id": "e99r99", "parent": last["commit_id"], "round": last["round"] + 1,
             "param_hash": "0" * 64, "cursor_end": last["cursor_end"] + 96}
    with coord.open("a") as f:
        f.write(json.dumps(later) + "\n")
    v = frontier_is_tip(run_dir)
    assert not v.ok and "e99r99" in v.detail, v


def test_a_fired_fault_missing_from_chaos_log_fails_the_run(short_soak: list[dict[str, Any]], tmp_path: Path) -> None:
    run_dir, summary = _copy(short_soak[0], tmp_path)
    sc = random_schedule(SEED, th=Thresholds.of(soak_config(tmp_path)), n_faults=SHORT_FAULTS)
    assert faults_logged(run_dir, summary, sc).ok
    log = run_dir / "logs" / "chaos.jsonl"
    lines = log.read_text().splitlines()
    dropped = next(i for i, line in enumerate(lines) if '"event": "fault_injected"' in line)
    log.write_text("\n".join(lines[:dropped] + lines[dropped + 1:]) + "\n")
    v = faults_logged(run_dir, summary, sc)
    assert not v.ok and "no fault_injected in chaos.jsonl" in v.detail, v
    summary["chaos"]["never_fired"].append({**summary["chaos"]["faults"][1], "status": "pending"})
    assert "never fired" in faults_logged(run_dir, summary, sc).detail


def test_short_of_the_target_or_an_unclean_exit_fails_the_run(short_soak: list[dict[str, Any]]) -> None:
    summary = json.loads((Path(short_soak[0]["run_dir"]) / "summary.json").read_text())
    target, _ = run_end(soak_config(Path("/nonexistent")))
    assert reached_target(summary, target).ok and clean_exit(summary).ok
    assert not reached_target({**summary, "useful_tokens": target - 1024}, target).ok
    assert not clean_exit({**summary, "exit_codes": {**summary["exit_codes"], "b": -9}, "clean_exit": False}).ok
    assert not clean_exit({**summary, "timed_out": True}).ok  # stopped by the launcher: not a clean end
