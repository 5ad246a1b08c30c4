"""A step of the host's wall clock during a run (NTP) must not change its time to target.

Found in `make sim-validate`: one emulated elastic run over slow links measured 145.5 s to target
against its repeat's 126.0 s, with the same commits at the same monotonic times; every process's
wall_ns had jumped 19.6 s against mono_ns mid-run. A simulated run's logs stand in here (the same
event records), with the same step written into them.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.artifact import build_artifact
from ground.config import load_config, merge
from sim.model import SimModel
from sim.world import simulate
from tests.conftest import COMPARE_CFG

STEP_NS = 19_600_000_000


def _step_wall_clock(run: Path, after_mono_ns: int) -> None:
    """Every event logged after `after_mono_ns` gets its wall times STEP_NS later, as after an NTP step."""
    for f in (run / "logs").glob("*.jsonl"):
        out = []
        for line in f.read_text().splitlines():
            e = json.loads(line)
            if e["mono_ns"] > after_mono_ns:
                for k in ("wall_ns", "start_wall_ns", "end_wall_ns"):
                    if k in e:
                        e[k] += STEP_NS
            out.append(json.dumps(e))
        f.write_text("\n".join(out) + "\n")


def test_a_wall_clock_step_mid_run_leaves_the_time_to_target_and_is_said(tmp_path: Path) -> None:
    out = tmp_path / "run"
    simulate(load_config(merge(COMPARE_CFG, {"run_id": "step"})), None, SimModel(), out=out)
    before = build_artifact([out])["runs"][0]["metrics"]["active_time"]
    assert before["value"] > 10 and "stepped" not in before["note"]
    commits = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    commits = [e for e in commits if e["event"] == "commit"]
    _step_wall_clock(out, commits[len(commits) // 2]["mono_ns"])
    after = build_artifact([out])["runs"][0]["metrics"]["active_time"]
    assert after["value"] == before["value"]  # the monotonic clock did not move
    assert "the wall clock stepped by 19.6 s" in after["note"]
