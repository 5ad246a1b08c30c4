"""The coordinator's rules as a pure core (coordinator/core.py), replayed from a real run.

The replay test takes a real four-policy comparison (the session's `comparison` fixture: b SIGKILLed
after round 2 commits, restarted 2 s later), feeds each run's logged coordinator inputs (`coord_input`)
through the core (tests/helpers_coordinator_core.py `replay`), and requires the coordinator's logged
decisions (epochs, members, plans, commits, frontiers, reasons) and its journal, exactly. The core on a
virtual clock: tests/unit/test_coordinator_core.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.eventlog import read_events
from tests.helpers_coordinator_core import replay


@pytest.mark.integration
def test_a_real_four_policy_comparison_replays_through_the_core_to_the_same_decisions(comparison) -> None:
    _out, index = comparison
    assert sorted(r["policy"] for r in index["runs"]) == ["elastic", "oracle", "restart", "stall"]
    for r in index["runs"]:
        inputs, decisions = replay(Path(r["run_dir"]))
        names = {e["event"] for e in read_events(Path(r["run_dir"]) / "logs" / "coord.jsonl")}
        assert inputs > 50 and decisions > 10, (r["policy"], inputs, decisions)
        assert {"membership_epoch", "commit", "recovery_decision", "run_complete"} <= names, r["policy"]
