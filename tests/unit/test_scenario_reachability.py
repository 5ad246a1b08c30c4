"""A scenario says when its faults cannot fire: refused up front when a progress trigger lies past
the run's target. Running with such a scenario: tests/live/test_scenario_reachability.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.scenario import Scenario, load_scenario, unreachable_triggers
from xdc.cli import DEMO, main as xdc_main
from chaos.reach import ScenarioBeyondRun, check_scenario_fits, run_end
from ground.config import load_config, merge
from tests.helpers_scenario_reachability import ROUND, SMALL

ROOT = Path(__file__).resolve().parents[2]


def test_run_end_is_the_last_commit_of_a_fault_free_run() -> None:
    cfg = load_config(SMALL)
    assert run_end(cfg) == (3 * ROUND, 3 * 4)
    # The target is rounded up to whole site batches, and the last round is cut there.
    cfg = load_config(merge(SMALL, {"train": {"target_useful_tokens": 3 * ROUND + 1}}))
    assert run_end(cfg) == (3 * ROUND + 8 * 128, 4 * 4)


def test_progress_triggers_past_the_end_are_found_and_wall_time_ones_are_not() -> None:
    sc = (Scenario.build("x").crash("b", at_useful_tokens=3 * ROUND, restart_after_s=1)  # the last commit: fires
          .hang("a", at_useful_tokens=3 * ROUND + 1, duration_s=1)                      # past it
          .reset("a<->b", at_step=13, duration_s=1)                                      # past step 12
          .blackhole("c", at_step=12, duration_s=1)
          .degrade("a->c", at_s=10_000, duration_s=1, latency_ms=5))                     # judged only at the end
    bad = unreachable_triggers(sc, end_useful_tokens=3 * ROUND, end_step=12)
    assert [(b.index, b.key, b.value, b.end) for b in bad] == [(1, "at_useful_tokens", 3 * ROUND + 1, 3 * ROUND),
                                                                (2, "at_step", 13, 12)]
    assert str(bad[0]) == ("faults[1] (site_hang a) triggers at at_useful_tokens=36,865, but the run ends at "
                           "36,864 useful tokens: it would never fire")


def test_refusal_names_the_fault_its_trigger_and_the_target() -> None:
    cfg = load_config({})  # the default target: 65,536 useful tokens
    sc = load_scenario(ROOT / "scenarios" / "one-outage.yaml")
    with pytest.raises(ScenarioBeyondRun) as e:
        check_scenario_fits(cfg, sc)
    msg = str(e.value)
    assert "faults[0] (site_crash b)" in msg and "at_useful_tokens=400,000" in msg
    assert "train.target_useful_tokens=65536" in msg and "--allow-unfired" in msg
    warnings = check_scenario_fits(cfg, sc, allow_unfired=True)
    assert any("faults[0]" in w for w in warnings)


@pytest.mark.parametrize("argv", [
    ["run", "--scenario", "LATE", "--set", "recovery.policy=elastic"],
    ["compare", "LATE"],
    ["run", "--scenario", "scenarios/one-outage.yaml", "--set", "train.target_useful_tokens=65536"],
])
def test_cli_refuses_an_outage_past_the_target(argv: list[str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A crash at 2,000,000 tokens is past the default recipe's 1,179,648; the demo's outage (400,000) is past
    a 65,536-token target. Refused before anything starts, naming the fault, its trigger and the target."""
    late = tmp_path / "late.yaml"
    late.write_text(json.dumps({"name": "late", "faults": [
        {"kind": "site_crash", "target": "b", "at_useful_tokens": 2_000_000, "duration_s": 10}]}))
    runs = tmp_path / "runs"
    argv = [argv[0], "--runs-dir", str(runs), *argv[1:]]
    argv = [str(late) if a == "LATE" else str(ROOT / a) if a.startswith("scenarios/") else a for a in argv]
    assert xdc_main(argv) == 2
    err = capsys.readouterr().err
    trigger, target = ("400,000", "65,536") if "scenarios/one-outage.yaml" in " ".join(argv) else ("2,000,000", "1,179,648")
    assert "scenario error:" in err and "site_crash b" in err and f"at_useful_tokens={trigger}" in err
    assert f"{target} useful tokens" in err and "--allow-unfired" in err
    assert not runs.exists() or not any(runs.iterdir()), "nothing may start for a refused scenario"


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_fits_the_demo_preset(path: Path) -> None:
    """`xdc compare scenarios/X.yaml --demo` (and the README's `xdc run` example, which sets the
    demo's target) can fire every progress-triggered fault."""
    cfg = load_config(DEMO)
    assert check_scenario_fits(cfg, load_scenario(path, sites=cfg.cluster.sites)) == []
