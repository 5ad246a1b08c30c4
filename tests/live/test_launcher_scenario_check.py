"""A scenario built in Python is checked against the run's processes before anything starts: a link
spec that names no link (the storm benchmark's 'a_to_b', a proxy name, not a link spec) used to be
accepted, fail only when the fault fired mid-run (`fault_failed`), and leave the run without that
fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.scenario import Scenario, ScenarioError
from ground.config import load_config
from cluster.launcher import Launcher


def test_a_proxy_name_as_a_link_target_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    cfg = load_config({"runs_dir": str(tmp_path)})
    bad = Scenario.build("storm").crash("b", at_s=30).blackhole("a_to_b", at_s=150, duration_s=5)
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.target: unknown process 'a_to_b' in link spec 'a_to_b'"):
        Launcher(cfg, scenario=bad)
    assert not any(tmp_path.iterdir())  # nothing was created, nothing started


def test_a_site_the_cluster_does_not_have_is_refused_and_a_good_scenario_is_accepted(tmp_path: Path) -> None:
    cfg = load_config({"runs_dir": str(tmp_path)})
    with pytest.raises(ScenarioError, match="unknown site 'd'"):
        Launcher(cfg, scenario=Scenario.build("t").crash("d", at_s=1))
    good = Scenario.build("t").blackhole("a<->b", at_s=150, duration_s=5).reset("a->c", at_s=10, duration_s=1)
    assert Launcher(cfg, scenario=good).scenario is good
