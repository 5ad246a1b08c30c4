"""Replay a run's controller decisions from its logged observations (the controller is a pure function).

`replay_decisions(coord_events, cfg)` walks the coordinator's event history in order, rebuilding
the observation list the coordinator held (`cycle_observed`, the newest 64, emptied when a
coordinator incarnation starts) and calling the run's rule at every logged `controller_decision`:
after a cycle with the observations so far, inside a cycle with the logged elapsed time. It returns
one line per decision that the replay does not reproduce exactly (action, setting, reason);
an empty list means every decision is what the logged evidence gives.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Iterable, Mapping

from control.controller import decide
from control.observations import Observation
from control.progress_rate import decide_after_cycle, decide_in_cycle
from ground.config import RunConfig
from ground.setting import ConsistencySetting

KEPT = 64  # observations the coordinator keeps (coordinator/settings.py EpochSettings.after_commit)
_FIELDS = tuple(f.name for f in fields(Observation))


def observation_of(e: Mapping[str, Any]) -> Observation:
    """The Observation a `cycle_observed` event logged (non-finite floats are logged as strings)."""
    def val(k: str) -> Any:
        v = e[k]
        return float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v
    return Observation(**{k: val(k) for k in _FIELDS})


def replay_decisions(coord_events: Iterable[Mapping[str, Any]], cfg: RunConfig) -> list[str]:
    acfg = cfg.train.adaptive
    obs: list[Observation] = []
    bad: list[str] = []
    n = 0
    for e in coord_events:
        kind = e.get("event")
        if kind == "coordinator_started":
            obs = []
        elif kind == "cycle_observed":
            obs = (obs + [observation_of(e)])[-KEPT:]
        elif kind == "controller_decision":
            n += 1
            current = ConsistencySetting.from_json(e["current"])
            ev = e.get("evidence") or {}
            if ev.get("in_cycle"):
                got = decide_in_cycle(obs, current, int(ev["elapsed_ns"]), acfg)
            elif acfg.rule == "progress_rate":
                got = decide_after_cycle(obs, current, acfg)
            else:
                got = decide(obs, current, acfg)
            want = (e["action"], ConsistencySetting.from_json(e["setting"]), e["reason"])
            have = (got.action, got.setting, got.reason) if got is not None else None
            if have != want:
                bad.append(f"decision {n} (round {e.get('round')}): logged {want[0]} {want[1].label()} "
                           f"({want[2]!r}); replay gives " + (f"{have[0]} {have[1].label()} ({have[2]!r})"
                                                              if have else "no in-cycle decision"))
    return bad
