"""The fault kinds' one registry (ground/faults.py): every kind has a nemesis, a timeline drawing and
parameter defaults the validator fills in, and the validator accepts exactly the registry's kinds."""

from __future__ import annotations

import pytest

from analysis.timeline import MARKS, SITE_FAULTS
from chaos.nemesis import NEMESES, Nemesis, nemesis_for
from chaos.scenario import Scenario, ScenarioError
from ground.faults import FAULT_KINDS as KINDS
from ground.faults import DRAWN_AS, FAULT_KINDS, TARGETS, drawn_as, links_hit, site_kinds, takes_down

TARGET_OF = {"site": "b", "link": "a<->b", "store": "store", "coord": "coord", "any": ""}
GIVEN = {"link_degrade": {"latency_ms": 10}}  # a kind that needs one of its optional params


def _fault(kind: str):
    return Scenario.build("t").add(kind, TARGET_OF[FAULT_KINDS[kind].target], at_step=1,
                                   **GIVEN.get(kind, {})).faults[0]


def test_every_kind_has_a_nemesis_a_drawing_and_defaults() -> None:
    assert set(NEMESES) == set(FAULT_KINDS)
    for kind, spec in FAULT_KINDS.items():
        assert spec.target in TARGETS, kind
        n = nemesis_for(_fault(kind))
        assert isinstance(n, Nemesis) and type(n) is NEMESES[kind] and n.instant == spec.instant, kind
        assert spec.drawn_as in DRAWN_AS and set(DRAWN_AS) <= set(MARKS), kind
        assert drawn_as(kind) == spec.drawn_as
        # the validator fills in exactly the registry's defaults (plus what was given)
        assert dict(_fault(kind).params) == {**spec.defaults(), **GIVEN.get(kind, {})}, kind
        for name, p in spec.params.items():
            assert p.doc, (kind, name)


def test_the_validator_accepts_exactly_the_registrys_kinds() -> None:
    assert KINDS is FAULT_KINDS  # chaos.scenario's KINDS is the registry, not a copy
    for kind in FAULT_KINDS:
        assert _fault(kind).kind == kind
    with pytest.raises(ScenarioError) as e:
        Scenario.build("t").add("site_explode", "b", at_step=1)
    assert f"known: {sorted(FAULT_KINDS)}" in str(e.value)


def test_what_a_kind_takes_down_and_hits_comes_from_its_entry() -> None:
    assert {k for k in FAULT_KINDS if takes_down(k, {})} == {"site_crash", "site_preempt", "coord_crash"}
    assert takes_down("store_outage", {"mode": "kill"}) and not takes_down("store_outage", {"mode": "stop"})
    assert SITE_FAULTS == site_kinds() == ("site_crash", "site_preempt", "site_hang", "site_restart")
    links = ["a_to_b", "b_to_a", "a_to_c", "c_to_a", "b_to_c", "c_to_b", "a_to_coord", "b_to_store"]
    assert links_hit("link_blackhole", "a<->b", links) == {"a_to_b", "b_to_a", "a_to_c", "c_to_a", "b_to_c",
                                                            "c_to_b", "a_to_coord", "b_to_store"}
    assert links_hit("link_degrade", "c<-a", links) == {"a_to_b", "b_to_a", "a_to_c", "c_to_a", "b_to_c", "c_to_b",
                                                         "a_to_coord"}
    assert links_hit("coord_crash", "coord", links) == {"a_to_coord"}
    assert links_hit("noop", "", links) == set()
