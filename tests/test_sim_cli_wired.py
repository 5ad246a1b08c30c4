"""`xdc sim` reaches the simulator's own CLI (sim/cli.py) through the roof's command line."""

from __future__ import annotations

import json
from pathlib import Path

from xdc.cli import _main

ROOT = Path(__file__).resolve().parent.parent


def test_xdc_sim_run_writes_a_simulated_comparison(tmp_path: Path):
    out = tmp_path / "sim"
    rc = _main(["sim", "run", str(ROOT / "scenarios" / "one-outage.yaml"), "--sites", "3", "--policy", "all",
                "--out", str(out), "--set", "train.target_useful_tokens=1179648"])  # the crash's trigger: 400,000
    assert rc == 0
    index = json.loads((out / "index.json").read_text())
    assert index  # the comparison index `xdc analyze` reads
    for policy in ("stall", "restart", "elastic", "oracle"):
        assert (out / policy / "sim.json").is_file(), policy
        assert (out / policy / "logs" / "coord.jsonl").is_file(), policy


def test_xdc_sim_run_refuses_a_scenario_whose_crash_could_never_fire(tmp_path: Path, capsys) -> None:
    """The default target (65,536 tokens) ends before one-outage's crash (400,000): refused before
    anything is simulated, as `xdc run` refuses it; with --allow-unfired the run is made and the
    crash that never fired is named after it."""
    scen = str(ROOT / "scenarios" / "one-outage.yaml")
    out = tmp_path / "sim"
    assert _main(["sim", "run", scen, "--sites", "3", "--policy", "all", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "faults[0] (site_crash b) triggers at at_useful_tokens=400,000" in err and "--allow-unfired" in err
    assert not out.exists(), "a refused scenario wrote a run"
    assert _main(["sim", "run", scen, "--sites", "3", "--policy", "elastic", "--out", str(out),
                  "--allow-unfired"]) == 0
    got = capsys.readouterr()
    assert "NEVER FIRED: faults[0] site_crash b (trigger at_useful_tokens=400000)" in got.out
    assert "warning: elastic: NEVER FIRED" in got.err
    finished = [json.loads(x) for x in (out / "logs" / "chaos.jsonl").read_text().splitlines()]
    assert finished[-1]["event"] == "scenario_finished" and finished[-1]["never_fired"] == [0]
