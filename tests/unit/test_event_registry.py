"""Every event a process writes is in the registry (ground/events.py), in the code.

Every `emit("name", ...)`, `_emit("name", ...)` and `span("name", ...)` with a literal name in the
runtime packages is registered, by a module that the registry names. The logs of a real run:
tests/live/test_event_registry.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ground.events import EVENTS, STAMPED

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_envelope_check_names_each_malformed_stamped_field_and_agrees_with_its_fast_test() -> None:
    from ground.events import envelope_ok, envelope_problem

    good = {"id": "a:1", "event": "round_done", "wall_ns": 10, "mono_ns": 5, "run_id": "r", "process": "a",
            "pid": 7, "epoch": 0, "step": 3}
    span = {**good, "event": "compute", "start_wall_ns": 1, "end_wall_ns": 2, "start_mono_ns": 3, "end_mono_ns": 4}
    cases = {
        "ok": (good, None),
        "span ok": (span, None),
        "string mono": ({**good, "mono_ns": "5"}, "'mono_ns' is str '5', not int"),
        "bool epoch": ({**good, "epoch": True}, "'epoch' is bool True, not int"),
        "float wall": ({**good, "wall_ns": 1.5}, "'wall_ns' is float 1.5, not int"),
        "no pid": ({k: v for k, v in good.items() if k != "pid"}, "no 'pid' field"),
        "null process": ({**good, "process": None}, "'process' is null None, not str"),
        "span without end": ({k: v for k, v in span.items() if k != "end_mono_ns"},
                             "span bound 'end_mono_ns' is null, not int"),
        "span backwards": ({**span, "end_mono_ns": 2}, "span ends before it starts (2 < 3 mono_ns)"),
    }
    for name, (ev, want) in cases.items():
        assert envelope_problem(ev) == want, name
        assert envelope_ok(ev) is (want is None), name
