"""chaos/scenario.py: shipped scenarios load, errors name file:line and the dotted field, TOML works,
and the Python builder gives the very objects the equivalent file gives."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chaos.scenario import Fault, Scenario, ScenarioError, Trigger, load_scenario, parse_scenario
from ground.faults import FAULT_KINDS as KINDS
from ground.faults import parse_link_target

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
SITES = ("a", "b", "c")
REQUIRED = ("one-outage", "preemption", "partition", "thin-link", "fault-storm")


def yaml_error(text: str, tmp_path: Path, sites: tuple[str, ...] | None = SITES) -> ScenarioError:
    p = tmp_path / "bad.yaml"
    p.write_text(textwrap.dedent(text).lstrip("\n"))
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p, sites=sites)
    assert str(ei.value).startswith(f"{p}:")
    return ei.value


# ------------------------------------------------------------------ shipped scenarios


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_and_is_documented(path: Path) -> None:
    sc = load_scenario(path, sites=SITES)
    assert sc.name == path.stem
    assert 20 <= len(sc.description) <= 300, sc.description  # a line or two
    for f in sc.faults:
        assert f.kind in KINDS
    assert Scenario.from_dict(sc.to_dict(), sites=SITES) == sc  # round-trips through plain data


def test_the_required_scenarios_ship() -> None:
    names = {p.stem for p in SCENARIOS.glob("*.yaml")}
    assert set(REQUIRED) <= names
    one = load_scenario(SCENARIOS / "one-outage.yaml", sites=SITES)
    assert [(f.kind, f.target, f.duration_s, f.params["restart"]) for f in one.faults] == [
        ("site_crash", "b", 10.0, True)]
    assert one.faults[0].trigger.by_progress
    pre = load_scenario(SCENARIOS / "preemption.yaml", sites=SITES).faults[0]
    assert (pre.kind, pre.target, pre.params["grace_s"]) == ("site_preempt", "c", 5.0)
    part = load_scenario(SCENARIOS / "partition.yaml", sites=SITES).faults[0]
    assert (part.kind, part.target) == ("link_blackhole", "a<->c")
    thin = load_scenario(SCENARIOS / "thin-link.yaml", sites=SITES).faults[0]
    assert (thin.kind, thin.target, thin.params["bandwidth_kbps"], thin.params["latency_ms"]) == (
        "link_degrade", "a<->b", 200, 80)
    storm = load_scenario(SCENARIOS / "fault-storm.yaml", sites=SITES)
    assert len({f.kind for f in storm.faults}) >= 6


def test_storm_faults_overlap_in_time() -> None:
    storm = load_scenario(SCENARIOS / "fault-storm.yaml", sites=SITES)
    # the background degradation is injected early and still active when progress faults fire
    bg = storm.faults[0]
    assert bg.trigger.key == "at_s" and bg.duration_s is not None and bg.duration_s >= 30


# ------------------------------------------------------------------ errors: line + field


def test_unknown_kind_names_line_and_field(tmp_path: Path) -> None:
    e = yaml_error("""
        name: x
        description: d
        faults:
          - kind: site_crash
            target: b
            at_s: 3
          - kind: crsh
            target: b
            at_s: 10
        """, tmp_path)
    assert (e.line, e.field) == (7, "faults[1].kind")
    assert "unknown fault kind 'crsh'" in e.reason and "site_crash" in e.reason
    assert str(e) == f"{e.file}:7: faults[1].kind: {e.reason}"


def test_two_triggers(tmp_path: Path) -> None:
    e = yaml_error("""
        name: x
        faults:
          - kind: site_hang
            target: a
            duration_s: 2
            at_s: 3
            at_useful_tokens: 4096
        """, tmp_path)
    assert (e.line, e.field) == (7, "faults[0].at_useful_tokens")
    assert "exactly one trigger" in e.reason and "at_s and at_useful_tokens" in e.reason


def test_no_trigger(tmp_path: Path) -> None:
    e = yaml_error("""
        name: x
        faults:
          - kind: site_hang
            target: a
        """, tmp_path)
    assert (e.line, e.field) == (3, "faults[0]") and "missing trigger" in e.reason


@pytest.mark.parametrize("target,reason", [
    ("d", "unknown site 'd'"),
    ("coord", "not the 'coord' service"),
    ("a<->b", "is not a site name"),
])
def test_bad_process_target(tmp_path: Path, target: str, reason: str) -> None:
    e = yaml_error(f"""
        name: x
        faults:
          - kind: site_crash
            at_s: 1
            target: "{target}"
        """, tmp_path)
    assert (e.line, e.field) == (5, "faults[0].target")
    assert reason in e.reason


@pytest.mark.parametrize("target,reason", [
    ("a<->d", "unknown process 'd'"),
    ("a->a", "two different processes"),
    ("coord<->store", "no link between coord and store"),
    ("a=>b", "not a process name"),
])
def test_bad_link_target(tmp_path: Path, target: str, reason: str) -> None:
    e = yaml_error(f"""
        name: x
        faults:
          - kind: link_blackhole
            target: "{target}"
            at_step: 3
        """, tmp_path)
    assert (e.line, e.field) == (4, "faults[0].target")
    assert reason in e.reason


def test_unknown_site_passes_without_a_site_list_but_not_with_one(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nfaults:\n  - {kind: site_crash, target: d, at_s: 1}\n")
    assert load_scenario(p).faults[0].target == "d"
    with pytest.raises(ScenarioError, match=r"s.yaml:3: faults\[0\].target: unknown site 'd'"):
        load_scenario(p, sites=SITES)


def test_missing_field(tmp_path: Path) -> None:
    e = yaml_error("""
        name: x
        faults:
          - kind: site_crash
            at_s: 1
        """, tmp_path)
    assert (e.line, e.field) == (3, "faults[0].target") and "missing" in e.reason
    e = yaml_error("""
        name: x
        faults:
          - target: b
            at_s: 1
        """, tmp_path)
    assert (e.line, e.field) == (3, "faults[0].kind") and "missing" in e.reason
    e = yaml_error("""
        name: x
        faults:
          - kind: link_degrade
            target: a<->b
            at_s: 1
            params:
              toxicity: 0.5
        """, tmp_path)
    assert (e.line, e.field) == (6, "faults[0].params") and "latency_ms" in e.reason


@pytest.mark.parametrize("line,field,bad,expect", [
    (5, "faults[0].at_s", "at_s: ten", "expected a number of seconds, got a string 'ten'"),
    (5, "faults[0].at_step", "at_step: 2.5", "expected an integer"),
    (5, "faults[0].at_useful_tokens", "at_useful_tokens: true", "expected an integer, got a boolean"),
    (5, "faults[0].at_s", "at_s: -1", "must be >= 0"),
])
def test_wrong_type_of_trigger(tmp_path: Path, line: int, field: str, bad: str, expect: str) -> None:
    e = yaml_error(f"""
        name: x
        faults:
          - kind: link_reset
            target: a->b
            {bad}
        """, tmp_path)
    assert (e.line, e.field) == (line, field)
    assert expect in e.reason


def test_wrong_type_of_param_and_duration(tmp_path: Path) -> None:
    e = yaml_error("""
        name: x
        faults:
          - kind: link_degrade
            target: a->b
            at_s: 1
            duration_s: 3
            params:
              latency_ms: "80"
        """, tmp_path)
    assert (e.line, e.field) == (8, "faults[0].params.latency_ms") and "expected an integer" in e.reason
    e = yaml_error("""
        name: x
        faults:
          - kind: link_degrade
            target: a->b
            at_s: 1
            duration_s: soon
            params: {latency_ms: 80}
        """, tmp_path)
    assert (e.line, e.field) == (6, "faults[0].duration_s")
    e = yaml_error("""
        name: x
        faults: {kind: site_crash}
        """, tmp_path)
    assert (e.line, e.field) == (2, "faults") and "expected a list" in e.reason


@pytest.mark.parametrize("body,line,field,reason", [
    ("kind: link_degrade\n    target: a->b\n    at_s: 1\n    params: {bandwidth_kbps: 0}", 6,
     "faults[0].params.bandwidth_kbps", "must be > 0"),
    ("kind: site_preempt\n    target: c\n    at_s: 1\n    duration_s: 2\n    params: {grace_s: 5}", 6,
     "faults[0].duration_s", "grace_s"),
    ("kind: site_restart\n    target: c\n    at_s: 1\n    duration_s: 2", 6, "faults[0].duration_s",
     "heals itself at once"),
    ("kind: site_hang\n    target: c\n    at_step: 10\n    heal: {at_step: 5}", 6, "faults[0].heal.at_step",
     "must come after"),
    ("kind: site_hang\n    target: c\n    at_step: 10\n    heal: {at_step: 50}\n    duration_s: 3", 6,
     "faults[0].heal", "not both"),
    ("kind: site_hang\n    target: c\n    at_step: 10\n    duraton_s: 3", 6, "faults[0].duraton_s",
     "did you mean 'duration_s'"),
    ("kind: site_hang\n    target: c\n    at_step: 10\n    params: {x: 1}", 6, "faults[0].params.x",
     "takes no parameters"),
    ("kind: store_outage\n    at_step: 10\n    params: {mode: pause}", 5, "faults[0].params.mode",
     "not one of ['stop', 'kill']"),
    ("kind: store_outage\n    target: coord\n    at_step: 10", 4, "faults[0].target", "acts on 'store'"),
])
def test_semantic_errors(tmp_path: Path, body: str, line: int, field: str, reason: str) -> None:
    e = yaml_error("name: x\nfaults:\n  - " + body + "\n", tmp_path)
    assert (e.line, e.field) == (line, field), str(e)
    assert reason in e.reason, str(e)


def test_top_level_and_syntax_errors(tmp_path: Path) -> None:
    e = yaml_error("name: x\nfautls: []\n", tmp_path)
    assert (e.line, e.field) == (2, "fautls") and "did you mean 'faults'" in e.reason
    e = yaml_error("name: x\nfaults:\n  - kind: site_hang\n    kind: site_crash\n", tmp_path)
    assert (e.line, e.field) == (4, "faults[0].kind") and "duplicate key" in e.reason
    e = yaml_error("name: x\nfaults: [\n  - a: b\n", tmp_path)
    assert e.line is not None and "not valid YAML" in e.reason
    e = yaml_error("- just\n- a list\n", tmp_path)
    assert e.line == 1 and "expected a scenario" in e.reason
    with pytest.raises(ScenarioError, match="cannot read scenario file"):
        load_scenario(tmp_path / "absent.yaml")


# ------------------------------------------------------------------ TOML


def test_toml_scenario_equals_yaml(tmp_path: Path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text(textwrap.dedent("""
        name: s
        description: the same in both formats
        seed: 7
        faults:
          - kind: site_crash
            target: b
            at_useful_tokens: 90000
            duration_s: 10
          - kind: link_degrade
            target: a<->b
            at_s: 5
            heal: {at_step: 40}
            params: {latency_ms: 80, bandwidth_kbps: 200, slicer: {average_size: 100}}
        """))
    t = tmp_path / "s.toml"
    t.write_text(textwrap.dedent("""
        name = "s"
        description = "the same in both formats"
        seed = 7

        [[faults]]
        kind = "site_crash"
        target = "b"
        at_useful_tokens = 90000
        duration_s = 10

        [[faults]]
        kind = "link_degrade"
        target = "a<->b"
        at_s = 5
        heal = {at_step = 40}
        [faults.params]
        latency_ms = 80
        bandwidth_kbps = 200
        slicer = {average_size = 100}
        """))
    assert load_scenario(t, sites=SITES) == load_scenario(y, sites=SITES)
    f = load_scenario(t).faults[1]
    assert f.params["slicer"] == {"average_size": 100, "size_variation": 0, "delay_us": 0}
    assert f.heal == Trigger(at_step=40)


def test_toml_errors_name_line_and_field(tmp_path: Path) -> None:
    t = tmp_path / "bad.toml"
    t.write_text(textwrap.dedent("""
        name = "t"

        [[faults]]
        kind = "site_crash"
        target = "b"
        at_s = 3

        [[faults]]
        kind = "link_degrade"
        target = "a->b"
        at_step = 4
        params = {latency_ms = 80, bandwdith_kbps = 3}
        """).lstrip("\n"))
    with pytest.raises(ScenarioError) as ei:
        load_scenario(t, sites=SITES)
    assert (ei.value.line, ei.value.field) == (12, "faults[1].params.bandwdith_kbps")
    assert "did you mean 'bandwidth_kbps'" in str(ei.value)
    t.write_text('name = "t"\n\n[[faults]]\nkind = "crsh"\nat_s = 1\n')
    with pytest.raises(ScenarioError, match=r"bad.toml:4: faults\[0\].kind: unknown fault kind 'crsh'"):
        load_scenario(t)
    t.write_text('name = "t"\nfaults = [\n')
    with pytest.raises(ScenarioError, match="not valid TOML"):
        load_scenario(t)


# ------------------------------------------------------------------ the Python API


def test_builder_equals_the_equivalent_yaml(tmp_path: Path) -> None:
    built = (Scenario.build("mine", "a script's scenario", seed=3)
             .crash("b", at_s=10, restart_after_s=15)
             .blackhole("a<->c", at_step=20, duration_s=5)
             .preempt("c", grace_s=2, at_useful_tokens=50000, return_after_s=20)
             .hang("a", at_s=30, heal=Trigger(at_step=60))
             .degrade("a->b", at_s=1, duration_s=9, latency_ms=80, bandwidth_kbps=200)
             .reset("b", at_step=70, duration_s=1)
             .store_outage(mode="kill", at_step=80, duration_s=4)
             .coord_crash(at_step=90, restart_after_s=3)
             .restart("c", at_step=100)
             .noop("marker", at_s=2))
    y = tmp_path / "mine.yaml"
    y.write_text(textwrap.dedent("""
        name: mine
        description: a script's scenario
        seed: 3
        faults:
          - {kind: site_crash, target: b, at_s: 10, duration_s: 15}
          - {kind: link_blackhole, target: a<->c, at_step: 20, duration_s: 5}
          - {kind: site_preempt, target: c, at_useful_tokens: 50000, duration_s: 20, params: {grace_s: 2}}
          - {kind: site_hang, target: a, at_s: 30, heal: {at_step: 60}}
          - {kind: link_degrade, target: a->b, at_s: 1, duration_s: 9,
             params: {latency_ms: 80, bandwidth_kbps: 200}}
          - {kind: link_reset, target: b, at_step: 70, duration_s: 1}
          - {kind: store_outage, at_step: 80, duration_s: 4, params: {mode: kill}}
          - {kind: coord_crash, at_step: 90, duration_s: 3}
          - {kind: site_restart, target: c, at_step: 100}
          - {kind: noop, target: marker, at_s: 2}
        """))
    assert load_scenario(y, sites=SITES) == built
    assert built.faults[0] == Fault("site_crash", "b", Trigger(at_s=10.0), duration_s=15.0, params={"restart": True})
    assert built.faults[2].params == {"grace_s": 2.0, "restart": True}


def test_builder_validates_like_a_file() -> None:
    with pytest.raises(ScenarioError) as ei:
        Scenario.build("x").crash("b", at_s=1).blackhole("a<->c")
    assert ei.value.file == "<script>" and ei.value.line is None and ei.value.field == "faults[1]"
    assert "missing trigger" in str(ei.value)
    with pytest.raises(ScenarioError, match=r"faults\[0\].params.bandwidth_kbps: must be > 0"):
        Scenario.build("x").degrade("a->b", at_s=1, bandwidth_kbps=0)
    with pytest.raises(ScenarioError, match="unknown site 'z'"):
        Scenario.build("x").add("site_crash", "z", at_s=1, sites=SITES)
    # immutability: the chain builds new scenarios
    base = Scenario.build("x")
    one = base.crash("b", at_s=1)
    assert base.faults == () and len(one.faults) == 1


def test_link_target_grammar() -> None:
    assert parse_link_target("a<->b").directions() == [("a", "b"), ("b", "a")]
    assert parse_link_target("a->b").directions() == [("a", "b")]
    assert parse_link_target("a<-b").directions() == [("b", "a")]
    assert parse_link_target("b").directions() is None
    assert parse_link_target(" a <-> coord ").directions() == [("a", "coord"), ("coord", "a")]


def test_trigger_needs_exactly_one() -> None:
    with pytest.raises(ValueError):
        Trigger()
    with pytest.raises(ValueError):
        Trigger(at_s=1, at_step=2)
    assert Trigger(at_step=3).to_dict() == {"at_step": 3}


def test_empty_and_nameless(tmp_path: Path) -> None:
    p = tmp_path / "quiet.yaml"
    p.write_text("description: nothing happens\n")
    sc = load_scenario(p)
    assert sc == Scenario("quiet", "nothing happens", (), 0)
    assert parse_scenario("", "x.yaml").faults == ()
