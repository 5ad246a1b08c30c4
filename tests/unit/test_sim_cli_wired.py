"""`xdc sim` reaches the simulator's own CLI (sim/cli.py) through the roof's command line."""

from __future__ import annotations

import json
from pathlib import Path

from xdc.cli import _main

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_logged_run_of_many_sites_says_what_its_byte_counters_cost(tmp_path: Path, capsys) -> None:
    """Each site logs its cumulative counters over every site link each round (as the emulator does), so
    a logged round of N sites writes ~4 N (N-1) counter rows: the estimate is checked against a real
    simulated 12-site run, and a 400-site run is told before it starts (--no-logs: no note)."""
    from sim.cli import LOG_NOTE_BYTES_PER_ROUND, counter_log_bytes_per_round

    out = tmp_path / "twelve"
    assert _main(["sim", "run", "none", "--sites", "12", "--policy", "elastic", "--out", str(out),
                  "--set", "train.target_useful_tokens=294912"]) == 0  # 3 rounds: 12 sites x 8 x 8 steps x 128 tokens each
    rounds, counted = set(), 0
    for f in (out / "logs").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["event"] == "round_done":
                rounds.add(e["round"])
            if e["event"] == "wan_counters" and not e.get("final") and f.stem not in ("coord", "store"):
                counted += len(line) + 1
    per_round = counted / len(rounds)
    assert len(rounds) >= 3 and 0.5 < counter_log_bytes_per_round(12) / per_round < 2.0, (per_round, len(rounds))
    assert "writes about" not in capsys.readouterr().err  # 12 sites: nothing to say
    assert counter_log_bytes_per_round(400) >= LOG_NOTE_BYTES_PER_ROUND > counter_log_bytes_per_round(300)
    big = tmp_path / "four-hundred"
    assert _main(["sim", "run", "none", "--sites", "400", "--policy", "elastic", "--out", str(big),
                  "--max-sim-s", "0.5"]) == 0
    assert "note: with logs, every simulated round writes about 73 MB of byte counters" in capsys.readouterr().err
    assert _main(["sim", "run", "none", "--sites", "400", "--policy", "elastic", "--out", str(tmp_path / "n"),
                  "--max-sim-s", "0.5", "--no-logs"]) == 0
    assert "writes about" not in capsys.readouterr().err
