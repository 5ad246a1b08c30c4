"""The coordinator log replay through the pure core (coordinator/core.py): shared by
tests/live/test_coordinator_core.py (a real four-policy comparison) and tests/unit/test_sim.py (the
simulator's coordinator logs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coordinator import core
from ground.config import config_from_json
from ground.eventlog import read_events
from ground.journal import Journal


STAMPS = ("event", "id", "wall_ns", "mono_ns", "run_id", "process", "pid", "epoch", "step")


def _json(v: Any) -> Any:
    return json.loads(json.dumps(v, default=lambda o: list(o) if isinstance(o, (set, frozenset, tuple)) else repr(o)))


def replay(run_dir: Path) -> tuple[int, int]:
    """Feed the run's logged coordinator inputs through the core; (inputs, decisions) compared."""
    cfg = config_from_json(run_dir / "config.json")
    events = read_events(run_dir / "logs" / "coord.jsonl")
    assert not [e for e in events if e["event"] == "coordinator_recovered"], "a restarted coordinator: not this test"
    state = core.initial_state(cfg)
    produced: list[tuple[str, Any]] = []
    journal: list[dict[str, Any]] = []
    logged: list[tuple[str, Any]] = []
    inputs = 0
    for e in events:
        if e["event"] != "coord_input":
            if e["event"] not in core.EVENTS:  # the shell's and the WAN endpoint's own events
                continue
            logged.append((e["event"], {k: v for k, v in e.items() if k not in STAMPS}))
            continue
        inputs += 1
        if e["input"] == "tick":
            event: core.Received | core.Tick = core.Tick(tuple(sorted((k, int(v)) for k, v in e["lost"].items())))
        elif e.get("rejected"):
            # A rejected message changed nothing: its rejection is its only decision.
            produced += [x for x in logged[len(produced):] if x[0] == "report_rejected"][:1]
            continue
        else:
            event = core.Received(e["src"], e["inc"], e["msg_epoch"], e["kind"], e["body"])
        state, out = core.step(state, event, e["now_ns"], cfg)
        for o in out:
            if isinstance(o, core.Emit):
                fields = _json(o.fields)
                produced.append((o.event, {k: v for k, v in fields.items() if k not in STAMPS}))
            elif isinstance(o, core.Journal):
                journal.append(_json(o.record))
        # Everything the coordinator logged up to this input was decided by the inputs before it.
        assert [n for n, _ in produced] == [n for n, _ in logged], (run_dir.name, e["id"])
        for (name, got), (_n, want) in zip(produced, logged):
            assert got == want, (run_dir.name, name, got, want)
    records, problem = Journal.load(run_dir / "coordinator" / "journal.jsonl")
    assert problem is None and journal == records, run_dir.name
    return inputs, len(produced)
