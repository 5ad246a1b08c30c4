"""Stress families (chaos/families.py): seeded, deterministic scenario generators, and protocols
whose strata name a family instead of hand-written faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.families import EARLIEST, FAMILIES, LATEST, SEVERITIES, FamilyError, generate
from ground.faults import FAULT_KINDS
from studies.protocol import ProtocolError, parse_protocol

TINY = Path(__file__).resolve().parents[2] / "studies" / "protocols" / "tiny.yaml"
TARGET = 262_144


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_draws_valid_faults_inside_the_run_at_both_severities(family: str) -> None:
    for severity in SEVERITIES:
        sc = generate(family, severity, seed=7, target_useful_tokens=TARGET)
        assert sc.faults, f"{family}/{severity} drew no fault"
        assert sc.name == f"{family}-{severity}-s7" and sc.seed == 7
        for f in sc.faults:
            assert f.kind in FAULT_KINDS
            assert f.trigger.key == "at_useful_tokens"
            assert EARLIEST * TARGET <= f.trigger.value <= LATEST * TARGET
            assert f.duration_s is None or f.duration_s > 0


def test_a_draw_is_a_function_of_family_severity_seed_and_target() -> None:
    a = generate("partition", "severe", seed=30, target_useful_tokens=TARGET).to_dict()
    assert a == generate("partition", "severe", seed=30, target_useful_tokens=TARGET).to_dict()
    others = [generate("partition", "severe", seed=s, target_useful_tokens=TARGET).to_dict()["faults"]
              for s in range(31, 36)]
    assert all(o != a["faults"] for o in others)  # other seeds, other schedules
    assert generate("partition", "severe", seed=30, target_useful_tokens=2 * TARGET).to_dict() != a


def test_severe_draws_more_or_longer_stress_than_mild() -> None:
    def load(sev: str) -> float:  # total fault-seconds over 20 seeds
        return sum(f.duration_s or 0 for s in range(20)
                   for f in generate("straggler", sev, seed=s, target_useful_tokens=TARGET).faults)
    assert load("severe") > 2 * load("mild")


def test_unknown_family_or_severity_is_refused_with_the_choices() -> None:
    with pytest.raises(FamilyError, match="unknown stress family 'partitoin'"):
        generate("partitoin", "mild", seed=0, target_useful_tokens=TARGET)
    with pytest.raises(FamilyError, match="expected one of"):
        generate("partition", "extreme", seed=0, target_useful_tokens=TARGET)


def _with_outage(replacement: str) -> str:
    text = TINY.read_text()
    start = text.index("    faults:\n      name: tiny-outage")
    end = text.index("metrics:")
    return text[:start] + replacement + text[end:]


def test_a_stratum_can_name_a_family_and_the_protocol_holds_the_drawn_scenario() -> None:
    p = parse_protocol(_with_outage("    faults: {generator: straggler, severity: severe}\n"), "p.yaml")
    outage = p.strata[1]
    assert outage.family == "straggler"
    assert outage.faults_source == "generator:straggler/severe/seed 1/v1"
    assert outage.faults == generate("straggler", "severe", seed=outage.seed,
                                     target_useful_tokens=p.target_useful_tokens).to_dict()


def test_a_family_that_contradicts_the_generator_or_a_bad_severity_names_its_line() -> None:
    text = _with_outage("    family: partition\n    faults: {generator: straggler}\n")
    with pytest.raises(ProtocolError) as ei:
        parse_protocol(text, "p.yaml")
    assert ei.value.field == "strata[1].family" and "straggler" in ei.value.reason
    text = _with_outage("    faults: {generator: straggler, severity: extreme}\n")
    with pytest.raises(ProtocolError) as ei:
        parse_protocol(text, "p.yaml")
    assert ei.value.field == "strata[1].faults.severity"
    assert "severity: extreme" in text.splitlines()[ei.value.line - 1]
