"""The analysis benchmark's small version (bench/analysis_speed.py, `make bench` runs the 1M-event one).

The benchmark's synthetic run is what `xdc analyze` must read without a traceback and with every
checker passing (it asserts both); before this test, a change in the report's noise-floor lookup
made `xdc analyze` die on it (its config.json has no `data` section) and the benchmark wrote no
result, unnoticed until the next `make bench`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.analysis_speed import RUN_ID, synth_run
from bench.common import ROOT


def test_xdc_analyze_reads_the_benchmarks_synthetic_run_and_every_checker_passes(tmp_path: Path) -> None:
    run = tmp_path / RUN_ID
    n = synth_run(run, 20_000)
    out = tmp_path / "analysis"
    proc = subprocess.run([sys.executable, "-m", "xdc.cli", "analyze", str(run), "--out", str(out), "--no-report"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    art = json.loads((out / "artifact.json").read_text())
    assert art["runs"][0]["n_events"] == n
    checks = {c["name"]: c["status"] for c in art["checks"]}
    # same_frontier needs two runs of one comparison: the bench does not count it either.
    assert all(v == "pass" for k, v in checks.items() if k != "same_frontier"), checks
    # The hand-made config names no data section: no noise floor can be matched to it, and it says so.
    floor = art["learning_refs"]["noise_floor"]
    assert floor["evidence"] == "unavailable" and "no 'data'" in floor["reason"], floor
