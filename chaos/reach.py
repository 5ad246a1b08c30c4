"""Whether a scenario's faults can fire in a run: progress triggers against the run's end.

A fault triggered at a progress point (`at_useful_tokens`, `at_step`) past the last commit of a
fault-free run never fires, and a study of it would compare fault-free runs while claiming a
fault. `xdc run`, `xdc compare` and `xdc sim run` refuse such a scenario before running it unless
the user allows it (`--allow-unfired`; then the same lines are warnings); a study refuses it always.
"""

from __future__ import annotations

from typing import Any

from chaos.scenario import unreachable_triggers
from ground.config import RunConfig
from ground.schedule import rounds_for_target, steps_per_round, target_samples, target_tokens


class ScenarioBeyondRun(ValueError):
    """A scenario has faults whose progress trigger lies past the run's target (they cannot fire)."""


def run_end(cfg: RunConfig) -> tuple[int, int]:
    """(useful tokens, step) of the last commit of a fault-free run with every site."""
    tokens = target_tokens(cfg)
    if cfg.train.mode == "scripted":  # each round's own H (control/scripted.py)
        from control.scripted import planned_rounds

        return tokens, sum(st.steps_per_round for *_r, st in planned_rounds(cfg, len(cfg.cluster.sites),
                                                                           target_samples(cfg)))
    step = rounds_for_target(cfg, len(cfg.cluster.sites)) * steps_per_round(cfg)
    return tokens, step


def check_scenario_fits(cfg: RunConfig, scenario: Any, *, allow_unfired: bool = False) -> list[str]:
    """Raise ScenarioBeyondRun naming every fault whose trigger lies past the run's end (and the
    target), unless allow_unfired; then the same lines come back as warnings."""
    tokens, step = run_end(cfg)
    bad = unreachable_triggers(scenario, end_useful_tokens=tokens, end_step=step)
    if not bad:
        return []
    lines = [f"scenario {scenario.name!r}: {b}" for b in bad]
    target = (f"train.target_useful_tokens={cfg.train.target_useful_tokens} ({tokens:,} useful tokens, "
              f"step {step:,} with all {len(cfg.cluster.sites)} sites)")
    if allow_unfired:
        return [*lines, f"(--allow-unfired: running anyway; the run's target is {target})"]
    raise ScenarioBeyondRun("\n".join([*lines, f"the run's target is {target}; raise it (e.g. --set "
                                        f"train.target_useful_tokens=...), or pass --allow-unfired to run it anyway"]))
