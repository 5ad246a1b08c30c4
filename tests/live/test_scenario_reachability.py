"""A scenario says when its faults cannot fire: `run_comparison` refuses before starting anything, and
a fault that did not fire is reported at the end of a real run. The refusal's logic:
tests/unit/test_scenario_reachability.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.scenario import Scenario
from tests.conftest import events
from xdc.cli import main as xdc_main
from chaos.reach import ScenarioBeyondRun
from xdc.compare import run_comparison
from ground.config import load_config, merge
from tests.helpers_scenario_reachability import ROUND, SMALL


def test_run_comparison_refuses_before_starting_anything(tmp_path: Path) -> None:
    cfg = load_config(merge(SMALL, {"runs_dir": str(tmp_path)}))
    sc = Scenario.build("late").crash("b", at_useful_tokens=10 * ROUND, restart_after_s=1)
    with pytest.raises(ScenarioBeyondRun, match=r"faults\[0\] \(site_crash b\)"):
        run_comparison(cfg, sc, tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists()


def test_a_fault_that_did_not_fire_is_reported_at_the_end_of_the_run(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Real processes: with --allow-unfired the run goes ahead; the fault past the target and the
    one after the run (wall time) are reported in the output and in summary.json, the fault that
    fired is in chaos.jsonl under its index."""
    scen = tmp_path / "late.yaml"
    scen.write_text(json.dumps({"name": "late", "faults": [
        {"kind": "link_degrade", "target": "a<->b", "at_useful_tokens": ROUND, "duration_s": 1,
         "params": {"latency_ms": 10}},
        {"kind": "site_crash", "target": "b", "at_useful_tokens": 10 * ROUND, "duration_s": 1},
        {"kind": "site_hang", "target": "c", "at_s": 3600, "duration_s": 1}]}))
    conf = tmp_path / "small.json"
    conf.write_text(json.dumps(SMALL))
    rc = xdc_main(["run", "--config", str(conf), "--runs-dir", str(tmp_path / "runs"), "--quiet",
                   "--scenario", str(scen), "--allow-unfired"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "faults: 1 of 3 fired" in out
    assert "NEVER FIRED: faults[1] site_crash b (trigger at_useful_tokens=122880)" in out
    assert "NEVER FIRED: faults[2] site_hang c (trigger at_s=3600.0)" in out
    assert "warning:" in err and "faults[1] (site_crash b)" in err
    run_dir = (tmp_path / "runs" / "latest").resolve()
    chaos = json.loads((run_dir / "summary.json").read_text())["chaos"]
    assert chaos["fired"] == [0] and [f["index"] for f in chaos["never_fired"]] == [1, 2]
    injected = [e for e in events(run_dir, "chaos") if e["event"] == "fault_injected"]
    assert [(e["fault"], e["kind"], e["target"]) for e in injected] == [(0, "link_degrade", "a<->b")]
    scenario = json.loads((run_dir / "scenario.json").read_text())
    assert scenario["faults"][0]["kind"] == "link_degrade"  # the index in chaos.jsonl is the position here
