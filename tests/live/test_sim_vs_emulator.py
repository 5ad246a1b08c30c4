"""The simulator against the emulator on the same scenario (issue 15's first "must show").

The session's real four-policy comparison (`comparison` fixture: b SIGKILLed after round 2
commits, restarted 2 s later) is simulated run by run: the same config.json (policy, oracle
faults, links), the same scenario.json, the timing model fitted from that run's own spans
(sim/calibrate.py: so the test compares the rules' decisions, not the timing model's accuracy,
which is validated on held-out runs elsewhere). Each simulated run must make the same recovery
decisions (epoch numbers, members, restore, donor, joiners, drain, reason; and here, with the
fitted timing, the same start rounds and cursors) as the emulator logged, up to the first
failure the scenario did not cause (a heartbeat timeout under load on a shared machine), and
the four simulated runs analysed together must pass every applicable checker.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.artifact import build_artifact
from chaos.scenario import Scenario
from ground.config import config_from_json
from sim.calibrate import calibrate
from sim.decisions import compare_runs
from sim.model import SimModel
from sim.world import simulate

# Toxiproxy's byte counters do not exist in a simulation: unknown, never pass or fail.
NOT_APPLICABLE = {"byte_classes"}


@pytest.mark.integration
def test_a_simulated_one_outage_makes_the_emulators_recovery_decisions(comparison, tmp_path: Path) -> None:
    _out, index = comparison
    sim_runs, results = [], {}
    for r in index["runs"]:
        emu = Path(r["run_dir"])
        cfg = config_from_json(emu / "config.json")
        scenario = Scenario.from_dict(json.loads((emu / "scenario.json").read_text()))
        out = tmp_path / emu.name
        res = simulate(cfg, scenario, SimModel.from_calibration(calibrate([emu])), out=out)
        assert res.complete, f"{cfg.recovery.policy}: the simulated run did not complete"
        c = compare_runs(emu, out, cfg.recovery.policy)
        results[c.policy] = c
        sim_runs.append(out)
    report = {p: (c.status, c.compared, c.structural_mismatches, c.timing_differences, c.disturbed_by)
              for p, c in results.items()}
    print(json.dumps(report, indent=1))  # the per-policy result, for the log
    assert set(results) == {"stall", "restart", "elastic", "oracle"}
    assert all(c.status in ("match", "prefix match") for c in results.values()), report
    assert all(c.compared >= 1 for c in results.values()), report
    # Decisions before any unscheduled failure: the recovery from b's crash itself must be compared
    # in at least one policy's full run (a shared machine rarely disturbs all four).
    assert any(c.status == "match" and c.compared >= 2 for c in results.values()), report

    art = build_artifact(sim_runs)
    checks = {c["name"]: c for c in art["checks"]}
    assert checks["byte_classes"]["status"] == "unknown"
    failed = {n: c for n, c in checks.items() if n not in NOT_APPLICABLE and c["status"] != "pass"}
    assert not failed, failed
    assert all(s["provenance"]["simulated"]["evidence"] == "modeled" for s in art["runs"])
    assert not list(_measured(art["runs"])), "a simulated run's section labels a number measured"


def _measured(x: object, path: str = ""):
    """Paths of every `evidence: measured` label in x."""
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "evidence" and v == "measured":
                yield path
            yield from _measured(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _measured(v, f"{path}[{i}]")


@pytest.mark.integration
def test_sim_report_puts_the_simulation_beside_the_emulators_comparison(comparison, tmp_path: Path, capsys) -> None:
    """`xdc sim report`: every emulator run simulated with its own config and scenario, every claim
    with a falsifier and a status, and the page's sections (issue 15's report section)."""
    from sim.cli import main as sim_main

    _out, index = comparison
    cmp_dir = Path(index["runs"][0]["run_dir"]).parent
    before = sorted(p.name for p in cmp_dir.iterdir())
    assert sim_main(["report", str(cmp_dir), "--out", str(tmp_path / "rep")]) == 0
    assert sorted(p.name for p in cmp_dir.iterdir()) == before  # the emulator's directory is left alone
    assert "timing model: the prior (no --calibration)" in capsys.readouterr().out  # what the verdicts judge
    doc = json.loads((tmp_path / "rep" / "artifact.json").read_text())
    sims = sorted(p.name for p in (tmp_path / "rep" / "sim").iterdir() if p.is_dir())
    assert sims == ["elastic", "oracle", "restart", "stall"]
    claims = doc["claims"]
    assert {c["status"] for c in claims} <= {"survived", "falsified", "not run"}
    for pol in sims:  # time, lost tokens, application and WAN bytes per policy, each with its falsifier
        mine = [c for c in claims if c["claim"].startswith(f"{pol}:")]
        assert len(mine) == 4 and all(c["falsifier"] for c in mine)
        wan_claim = next(c for c in mine if "through the WAN" in c["claim"])
        assert wan_claim["status"] in ("survived", "falsified"), wan_claim  # both sides count their WAN bytes
        assert wan_claim["emulator"]["collective"] > 0 and wan_claim["simulator"]["collective"] > 0
        assert wan_claim["emulator"]["control"] > 0 and wan_claim["simulator"]["control"] > 0
        app_claim = next(c for c in mine if "application bytes" in c["claim"])
        assert app_claim["status"] in ("survived", "falsified"), app_claim  # both sides log their payloads
        assert app_claim["emulator"]["collective"] > 0 and app_claim["simulator"]["collective"] > 0
        time_claim = next(c for c in mine if "time to target" in c["claim"])
        assert time_claim["status"] in ("survived", "falsified") and time_claim["emulator"] > 0
    assert any("ranking" in c["claim"] for c in claims)
    html = (tmp_path / "rep" / "index.html").read_text()
    for section in ("scenario", "causal", "timeline", "results", "learning-guess", "published", "boundary", "ledger"):
        assert f"id='{section}'" in html, section
    assert "Accessible causal graph list" in html and "Accessible timeline event list" in html
    assert "ev-modeled" in html and "ev-measured" in html and "ev-prior" in html
    assert " B<span class=\"ev ev-modeled\"" in html  # the simulator's inter-site bytes, labelled modeled
