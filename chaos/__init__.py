"""Fault injection for xdc: scenarios (what breaks when), nemeses (how each fault is injected and
healed), the cluster handle they act through, and the driver that runs a scenario on a clock.

    from chaos import Scenario, load_scenario, ChaosDriver, NativeHandle
    sc = load_scenario("scenarios/one-outage.yaml", sites=("a", "b", "c"))
    ChaosDriver(sc, NativeHandle(run_dir, procs, spawn), run_dir).run(until=done)

Names are imported lazily, so `python -m chaos.driver` runs without a double import.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ChaosDriver": "chaos.driver", "until_run_finished": "chaos.driver",
    "ChaosError": "chaos.handle", "ClusterHandle": "chaos.handle", "MemoryLog": "chaos.handle",
    "NativeHandle": "chaos.handle", "RecordingHandle": "chaos.handle", "resolve_links": "chaos.handle",
    "NEMESES": "chaos.nemesis", "Nemesis": "chaos.nemesis", "NoOp": "chaos.nemesis", "nemesis_for": "chaos.nemesis",
    "KINDS": "chaos.scenario", "Fault": "chaos.scenario", "Scenario": "chaos.scenario",
    "ScenarioError": "chaos.scenario", "Trigger": "chaos.scenario", "load_scenario": "chaos.scenario",
    "parse_scenario": "chaos.scenario",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'chaos' has no attribute {name!r}")
