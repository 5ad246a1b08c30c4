"""Checkers that cannot pass vacuously, on purposely incomplete and purposely broken copies of real logs.

The logs are the session's real four-policy comparison (tests/conftest.py `comparison`: real
processes, the real Toxiproxy, site b SIGKILLed and restarted). Each copy removes a log or changes
one thing the way a bug (or a lost file) would. A checker whose evidence is gone must say `unknown`
and name what is missing; one that sees a violation must fail; `xdc analyze` exits 1 only on a fail.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from analysis import checkers as chk
from analysis.analyze import analyze
from analysis.artifact import build_artifact, validate_artifact
from xdc.cli import main as xdc_main

MANIFESTS = ("config.json", "topology.json", "scenario.json")


def _run(index: dict, policy: str) -> Path:
    return Path(next(r["run_dir"] for r in index["runs"] if r["policy"] == policy))


def _copy(run_dir: Path, dest: Path, logs: tuple[str, ...] | None = None,
          manifests: tuple[str, ...] = MANIFESTS) -> Path:
    (dest / "logs").mkdir(parents=True)
    for name in manifests:
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, dest / name)
    for p in (run_dir / "logs").glob("*.jsonl"):
        if logs is None or p.stem in logs:
            shutil.copy(p, dest / "logs" / p.name)
    return dest


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(path: Path, evs: list[dict]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


def _checks(art: dict) -> dict[str, dict]:
    return {c["name"]: c for c in art["checks"]}


def _append_work_in_epoch(log: Path, epoch: int) -> dict:
    """a trains one more batch in `epoch` (appended at the end of its log)."""
    evs = _read(log)
    w = [e for e in evs if e["event"] == "work_attempted"][-1]
    extra = {**w, "id": f"a:{len(evs)}", "epoch": epoch, "round": w["round"] + 1,
             "wall_ns": evs[-1]["wall_ns"] + 1, "mono_ns": evs[-1]["mono_ns"] + 1}
    _write(log, evs + [extra])
    return extra


# ------------------------------------------------------------------------------- incomplete
def test_a_run_with_only_one_site_log_acting_in_an_unannounced_epoch_passes_no_checker(comparison, tmp_path):
    _out, index = comparison
    run = _copy(_run(index, "elastic"), tmp_path / "run", logs=("a",), manifests=("config.json",))
    _append_work_in_epoch(run / "logs" / "a.jsonl", 99)
    checks = _checks(build_artifact([run]))
    assert {c["status"] for c in checks.values()} == {"unknown"}, {n: c["status"] for n, c in checks.items()}
    for name in ("log_integrity", "fencing", "work_ledger", "lineage", "no_fresh_overwrite"):
        assert any("no logs/coord.jsonl" in line for line in checks[name]["evidence"]), checks[name]
    assert "no launcher log" in checks["faults_fired"]["evidence"][0]


@pytest.mark.parametrize("removed, needing", [
    ("coord", ("log_integrity", "fencing", "work_ledger", "lineage", "no_fresh_overwrite")),
    ("store", ("log_integrity", "fencing", "work_ledger", "lineage", "same_frontier")),
    ("b", ("log_integrity", "fencing", "work_ledger", "no_fresh_overwrite", "same_frontier")),
    ("launcher", ("byte_classes",)),
    ("chaos", ("faults_fired",)),
])
def test_a_missing_log_makes_every_checker_that_needs_it_unknown(comparison, tmp_path, removed, needing):
    _out, index = comparison
    run = _copy(_run(index, "restart"), tmp_path / "run")
    (run / "logs" / f"{removed}.jsonl").unlink()
    checks = _checks(build_artifact([run]))
    for name in needing:
        assert checks[name]["status"] == "unknown", checks[name]
        assert checks[name]["evidence"], checks[name]
    if removed not in ("launcher", "chaos"):
        for name in needing:
            if name != "same_frontier":
                assert any(f"no logs/{removed}.jsonl" in line for line in checks[name]["evidence"]), checks[name]


# ------------------------------------------------------------------------------- broken
def test_a_site_acting_in_an_epoch_the_coordinator_never_announced_fails_fencing(comparison, tmp_path):
    _out, index = comparison
    run = _copy(_run(index, "stall"), tmp_path / "run")
    announced = [e["epoch"] for e in _read(run / "logs" / "coord.jsonl") if e["event"] == "membership_epoch"]
    extra = _append_work_in_epoch(run / "logs" / "a.jsonl", max(announced) + 5)
    fencing = _checks(build_artifact([run]))["fencing"]
    assert fencing["status"] == "fail", fencing
    assert any(extra["id"] in line and "never announced" in line for line in fencing["evidence"]), fencing


def test_one_corrupted_retained_sample_id_fails_work_ledger_and_same_frontier(comparison, tmp_path):
    _out, index = comparison
    ref = _copy(_run(index, "stall"), tmp_path / "ref")
    run = _copy(_run(index, "restart"), tmp_path / "run")
    last = [e for e in _read(run / "logs" / "coord.jsonl") if e["event"] == "commit"][-1]
    assert "a" in last["members"]
    log = run / "logs" / "a.jsonl"
    evs = _read(log)
    retained = {s for site in ("a", "b", "c") for e in _read(run / "logs" / f"{site}.jsonl")
                if e["event"] == "work_attempted" for s in e["samples"]}
    victim = next(e for e in evs if e["event"] == "work_attempted" and (e["epoch"], e["round"]) ==
                  (last["epoch"], last["round"]))
    victim["samples"] = [max(retained) + 1, *victim["samples"][1:]]  # one id: same count, same tokens
    _write(log, evs)
    checks = _checks(build_artifact([ref, run]))
    assert checks["work_ledger"]["status"] == "fail", checks["work_ledger"]
    assert any("differ from the samples_sha256" in line for line in checks["work_ledger"]["evidence"])
    assert checks["same_frontier"]["status"] == "fail", checks["same_frontier"]


def test_the_real_frontier_is_proven_equal_to_the_canonical_prefix(comparison, tmp_path):
    _out, index = comparison
    art = build_artifact([_copy(_run(index, p), tmp_path / p) for p in ("stall", "oracle")])
    for r in art["runs"]:
        proof = r["frontier"]["proof"]
        assert proof["status"] == "proven", proof
        assert proof["retained_sha256"] == proof["logged_samples_sha256"] == proof["canonical_sha256"]
    assert art["comparison"]["matched_frontier"]


# ------------------------------------------------------------------------------- faults
def _unfire(run: Path, at_useful_tokens: int) -> None:
    """The scenario's fault triggers past the run's end, and the chaos log shows it never fired."""
    scen = json.loads((run / "scenario.json").read_text())
    scen["faults"][0]["at_useful_tokens"] = at_useful_tokens
    (run / "scenario.json").write_text(json.dumps(scen))
    log = run / "logs" / "chaos.jsonl"
    evs = [e for e in _read(log) if e["event"] not in ("fault_injected", "fault_healed")]
    for e in evs:
        if e["event"] == "scenario_finished":
            e.update(statuses={"0": "pending"}, never_fired=[0])
        if e["event"] == "scenario_started":
            e["faults"][0]["at_useful_tokens"] = at_useful_tokens
    _write(log, evs)


def test_a_scheduled_fault_that_did_not_fire_fails_and_the_page_says_no_fault_fired(comparison, tmp_path):
    _out, index = comparison
    run = _copy(_run(index, "elastic"), tmp_path / "run")
    _unfire(run, 900_000)
    res = analyze([run], tmp_path / "out")
    faults = _checks(res.artifact)["faults_fired"]
    assert faults["status"] == "fail", faults
    assert any("did not fire" in x and "site_crash of b" in x and "beyond the run's target" in x
               for x in faults["evidence"]), faults
    html = res.report_path.read_text()
    assert "The same failure" not in html
    assert "<h2>Recovery timeline: no fault fired</h2>" in html
    assert "Scheduled faults that did not fire" in html
    assert res.artifact["runs"][0]["fault_schedule"]["not_fired"][0]["index"] == 0
    assert xdc_main(["analyze", str(run), "--out", str(tmp_path / "cli")]) == 1


def test_a_run_without_a_scenario_says_no_fault_was_scheduled(comparison, tmp_path):
    _out, index = comparison
    run = _copy(_run(index, "stall"), tmp_path / "run", manifests=("config.json", "topology.json"))
    (run / "logs" / "chaos.jsonl").unlink()
    res = analyze([run], tmp_path / "out")
    faults = _checks(res.artifact)["faults_fired"]
    assert faults["status"] == "unknown" and "no scenario was given" in faults["evidence"][0], faults
    assert faults["summary"] == "no fault was scheduled in 1 run(s): nothing to check"
    assert "<h2>Recovery timeline: no fault fired</h2>" in res.report_path.read_text()


def test_xdc_analyze_exits_1_only_when_a_checker_fails_not_when_one_is_unknown(comparison, tmp_path, monkeypatch):
    _out, index = comparison
    only = (("faults_fired", chk.check_faults_fired),)
    monkeypatch.setattr("analysis.artifact.run_checkers", lambda runs, ctx: chk.run_checkers(runs, ctx, only))
    unknown = _copy(_run(index, "oracle"), tmp_path / "unknown")
    (unknown / "logs" / "chaos.jsonl").unlink()
    assert xdc_main(["analyze", str(unknown), "--out", str(tmp_path / "o1")]) == 0
    failing = _copy(_run(index, "oracle"), tmp_path / "failing")
    _unfire(failing, 900_000)
    assert xdc_main(["analyze", str(failing), "--out", str(tmp_path / "o2")]) == 1
    passing = _copy(_run(index, "oracle"), tmp_path / "passing")
    assert xdc_main(["analyze", str(passing), "--out", str(tmp_path / "o3")]) == 0


# ------------------------------------------------------------------------------- FLOPs
def test_flop_totals_are_labelled_derived_and_the_schema_refuses_them_as_measured(comparison, tmp_path):
    _out, index = comparison
    art = build_artifact([_copy(_run(index, "stall"), tmp_path / "run")])
    m = art["runs"][0]["metrics"]
    for k in ("attempted_flops", "retained_flops", "lost_flops"):
        assert m[k]["evidence"] == "modeled" and "FlopCounterMode" in m[k]["derived"], m[k]
    assert art["runs"][0]["provenance"]["flops_per_token"]["evidence"] == "measured"  # the rate itself is counted
    validate_artifact(art)
    broken = json.loads(json.dumps(art))
    broken["runs"][0]["metrics"]["attempted_flops"]["evidence"] = "measured"
    with pytest.raises(jsonschema.ValidationError):
        validate_artifact(broken)
    broken = json.loads(json.dumps(art))
    del broken["runs"][0]["metrics"]["lost_flops"]["derived"]
    with pytest.raises(jsonschema.ValidationError):
        validate_artifact(broken)
