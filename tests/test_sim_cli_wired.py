"""`xdc sim` reaches the simulator's own CLI (sim/cli.py) through the roof's command line."""

from __future__ import annotations

import json
from pathlib import Path

from xdc.cli import _main

ROOT = Path(__file__).resolve().parent.parent


def test_xdc_sim_run_writes_a_simulated_comparison(tmp_path: Path):
    out = tmp_path / "sim"
    rc = _main(["sim", "run", str(ROOT / "scenarios" / "one-outage.yaml"), "--sites", "3", "--policy", "all",
                "--out", str(out)])
    assert rc == 0
    index = json.loads((out / "index.json").read_text())
    assert index  # the comparison index `xdc analyze` reads
    for policy in ("stall", "restart", "elastic", "oracle"):
        assert (out / policy / "sim.json").is_file(), policy
        assert (out / policy / "logs" / "coord.jsonl").is_file(), policy
