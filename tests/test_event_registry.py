"""Every event a process writes is in the registry (ground/events.py): in the code, and in a real run.

Static: every `emit("name", ...)`, `_emit("name", ...)` and `span("name", ...)` with a literal name in
the runtime packages is registered, by a module that the registry names. Dynamic: the logs of a real
four-policy comparison (the session's `comparison` fixture) hold only registered events.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ground.eventlog import read_events
from ground.events import EVENTS, STAMPED

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ground", "control", "wan", "coordinator", "site_agent", "checkpoint_store", "telemetry", "chaos", "xdc", "analysis", "studies")


def emitted_in_code() -> dict[str, set[str]]:
    """event name -> modules whose code emits it with a literal name."""
    out: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            module = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            for n in ast.walk(ast.parse(f.read_text())):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr in ("emit", "_emit", "span") and n.args
                        and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)):
                    out.setdefault(n.args[0].value, set()).add(module)
    return out


def test_every_event_the_code_emits_is_registered_with_the_module_that_emits_it() -> None:
    code = emitted_in_code()
    assert len(code) > 80  # the scan found the emitters
    missing = sorted(set(code) - set(EVENTS))
    assert not missing, f"events emitted but not in ground/events.py: {missing}"
    wrong = {n: sorted(m - set(EVENTS[n].emitted_by)) for n, m in code.items() if m - set(EVENTS[n].emitted_by)}
    assert not wrong, f"emitted by modules the registry does not name: {wrong}"


def test_registered_fields_never_shadow_the_stamped_ones() -> None:
    for name, ev in EVENTS.items():
        assert not set(ev.fields) & set(STAMPED) - {"epoch", "step"}, name


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
