"""A run's config under a recovery policy for a scenario: one rule for the emulator and the simulator.

    config_for_policy(cfg, policy, scenario) -> RunConfig

The oracle sees every site fault with a progress trigger coming (`oracle_faults`: (site, useful
tokens)); every policy gets the scenario's fault gates (ground/gates.py), so a fault fires at the
same point of the run whichever policy recovers from it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ground.config import RunConfig
from ground.faults import site_kinds
from ground.gates import gates_of


def oracle_faults(scenario: Any) -> tuple[tuple[str, int], ...]:
    """(site, useful tokens) of every site fault the oracle can see coming (progress triggers only)."""
    kinds = site_kinds()
    return tuple((f.target, int(tokens)) for f in scenario.faults
                 if f.kind in kinds and (tokens := getattr(f.trigger, "at_useful_tokens", None)) is not None)


def config_for_policy(cfg: RunConfig, policy: str, scenario: Any | None) -> RunConfig:
    """`cfg` under `policy` for `scenario` (None: no faults): the oracle's foreseen faults, the fault gates."""
    faults = oracle_faults(scenario) if scenario is not None and policy == "oracle" else ()
    gates = gates_of(scenario.faults) if scenario is not None else ()
    return replace(cfg, recovery=replace(cfg.recovery, policy=policy, oracle_faults=faults, fault_gates=gates))
