"""Controller v2 (`adaptive.rule = progress_rate`) on a real cluster (real processes, the real
Toxiproxy): the a<->b link collapses from 20 MB/s to 50 KB/s for a few cycles and heals. The setting changes while the collapse is on (inside the
first collapsed round, or right after it), comes back after the heal, does not flap, and every
logged decision is what the rule gives on the logged evidence (control/replay.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import Scenario
from control.controller import _rank
from control.replay import replay_decisions
from ground.config import load_config, merge
from ground.setting import ConsistencySetting
from tests.conftest import events
from tests.live.test_controller_live import ADAPTIVE
from cluster.launcher import launch

pytestmark = pytest.mark.integration

# This small model's rounds last about 0.1 s on the good link and 0.65 s collapsed: a collapsed round is
# 8 x its prediction but only 0.5 s over it, under the default 2 s (sized for the default recipe's
# rounds of seconds); 0.2 s lets the in-cycle rule see it.
V2 = merge(ADAPTIVE, {"train": {"adaptive": {"rule": "progress_rate", "min_overrun_s": 0.2}}})


@pytest.fixture(scope="module")
def collapse_v2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The a<->b link at 50 KB/s from 300,000 to 700,000 useful tokens: a collapsed round takes about 13 x
    its prediction (the issue's case: far beyond the noise), so the in-cycle rule acts on it."""
    cfg = load_config(merge(V2, {"runs_dir": str(tmp_path_factory.mktemp("adaptive-v2"))}))
    scenario = Scenario.build("deep-collapse", "a<->b at 50 KB/s for a few cycles").degrade(
        "a<->b", at_useful_tokens=300_000, heal={"at_useful_tokens": 700_000}, bandwidth_kbps=50)
    return launch(cfg, quiet=True, timeout_s=600, scenario=scenario)


def _s(d: dict) -> ConsistencySetting:
    return ConsistencySetting.from_json(d)


def test_v2_changes_during_the_collapse_returns_after_heal_and_replays(collapse_v2):
    run_dir, s = collapse_v2
    assert s["clean_exit"], s["exit_codes"]
    coord = events(run_dir, "coord")
    commits = [e for e in coord if e["event"] == "commit"]
    obs = {e["round"]: e for e in coord if e["event"] == "cycle_observed"}
    decisions = [e for e in coord if e["event"] == "controller_decision"]
    assert all(d["evidence"]["rule"] == "progress_rate" for d in decisions)
    cut = next(e for e in commits if e["useful_tokens"] >= 300_000)["round"]
    heal = next(e for e in commits if e["useful_tokens"] >= 700_000)["round"]
    collapsed = sorted(r for r, o in obs.items() if cut < r <= heal and o["goodput_bps"] < 1_000_000)
    assert len(collapsed) >= 2, [(r, o["goodput_bps"]) for r, o in obs.items() if r > cut][:10]
    changes = [d for d in decisions if d["action"] == "change"]
    # While the collapse is on: a change to cheaper communication, decided inside the first collapsed
    # round or after it committed at the latest (not three cycles later).
    during = [d for d in changes if collapsed[0] <= d["round"] <= collapsed[-1]]
    assert during, [(d["round"], d["action"], d["reason"]) for d in decisions if d["round"] > cut][:10]
    first = during[0]
    assert first["round"] <= collapsed[0] + 1, (collapsed, first["round"], first["reason"])
    assert _rank(_s(first["setting"])) > _rank(_s(first["current"])), first
    # ... and it took effect while the link was still collapsed (a setting_changed before the heal)
    applied = [e for e in coord if e["event"] == "setting_changed"]
    assert any(e["start_round"] <= collapsed[-1] for e in applied), (applied, collapsed)
    # After the heal it comes back to a setting with more syncs or less compression.
    after = [d for d in changes if d["round"] > collapsed[-1]]
    assert after and _rank(_s(after[-1]["setting"])) < _rank(_s(first["setting"])), after
    # No flapping: no return to a setting within three cycles of leaving it.
    for a, b in zip(changes, changes[1:]):
        assert not (b["setting"] == a["current"] and b["round"] - a["round"] <= 3), (a, b)
    # Every decision, after a cycle or inside one, is what the rule gives on the logged evidence.
    cfg = load_config(merge(V2, {"runs_dir": str(run_dir.parent)}))
    assert replay_decisions(coord, cfg) == []
