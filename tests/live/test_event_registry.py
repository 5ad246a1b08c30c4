"""Every event a process writes is in the registry (ground/events.py), in a real run: the logs of a
real four-policy comparison (the session's `comparison` fixture) hold only registered events. The
static check of the code: tests/unit/test_event_registry.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.eventlog import read_events
from ground.events import EVENTS


@pytest.mark.integration
def test_every_event_in_a_real_comparisons_logs_is_registered(comparison) -> None:
    _out, index = comparison
    seen: dict[str, int] = {}
    for r in index["runs"]:
        for log in sorted((Path(r["run_dir"]) / "logs").glob("*.jsonl")):
            for e in read_events(log):
                seen[e["event"]] = seen.get(e["event"], 0) + 1
    assert {"commit", "membership_epoch", "fault_injected", "coord_input", "round_done"} <= set(seen)
    unregistered = sorted(set(seen) - set(EVENTS))
    assert not unregistered, f"events in a real run's logs that ground/events.py lacks: {unregistered}"
