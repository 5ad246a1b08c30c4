"""Protocol files: errors name line and field; registration freezes the canonical hash; an edited
protocol is refused; an arm the config loader does not accept is refused with the loader's words."""

from __future__ import annotations

from pathlib import Path

import pytest

from studies.protocol import ProtocolError, arm_configs, load_protocol, parse_protocol
from studies.registry import RegistrationError, check, protocol_hash, register

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "studies" / "protocols" / "tiny.yaml"
SHIPPED = sorted((ROOT / "studies" / "protocols").glob("*.yaml"))


def _err(text: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as ei:
        parse_protocol(text, "p.yaml")
    return ei.value


def test_errors_name_the_line_and_the_field():
    text = TINY.read_text()
    e = _err(text.replace("alpha: 0.25, test", "alpha: 1.5, test", 1))
    assert e.field == "gates[0].alpha" and "must be > 0 and < 1" in e.reason
    assert text.splitlines()[e.line - 1].lstrip().startswith("alpha: 1.5") or "alpha: 1.5" in text.replace(
        "alpha: 0.25, test", "alpha: 1.5, test", 1).splitlines()[e.line - 1]
    e = _err(text.replace("policy: restart}", "policy: restrat}"))
    assert e.field == "arms[1].policy" and "did you mean 'restart'" in e.reason
    assert "restrat" in text.replace("policy: restart}", "policy: restrat}").splitlines()[e.line - 1]
    e = _err(text.replace("kind: site_crash", "kind: site_crsh"))
    assert e.field == "strata[1].faults.faults[0].kind" and "site_crsh" in e.reason
    assert "site_crsh" in text.replace("kind: site_crash", "kind: site_crsh").splitlines()[e.line - 1]
    e = _err(text.replace("metric: opportunity_ticks", "metric: ticks"))
    assert e.field == "gates[1].metric" and str(e).startswith(f"p.yaml:{e.line}: gates[1].metric:")
    e = _err(text.replace("contrast: {treatment: restart", "contrast: {treatment: nobody"))
    assert e.field == "contrast.treatment"
    e = _err(text.replace("question:", "questoin:"))
    assert e.field == "questoin" and "did you mean 'question'" in e.reason and e.line == 6


def test_canonical_hash_ignores_comments_and_layout_but_not_meaning():
    a = parse_protocol(TINY.read_text(), "a")
    b = parse_protocol("# another comment\n\n" + TINY.read_text().replace("name: tiny\n", "name:   'tiny'   # x\n"), "b")
    assert protocol_hash(a) == protocol_hash(b)
    c = parse_protocol(TINY.read_text().replace("margin: 0.05,\n     alpha: 0.25", "margin: 0.06,\n     alpha: 0.25"), "c")
    assert protocol_hash(c) != protocol_hash(a)


def test_a_protocol_edited_after_registration_is_refused(tmp_path):
    reg = tmp_path / "registry.json"
    f = tmp_path / "tiny.yaml"
    f.write_text(TINY.read_text())
    p = load_protocol(f)
    e1 = register(p, str(f), {"commit": "x"}, reg)
    assert e1["version"] == 1 and check(p, reg)["sha256"] == protocol_hash(p)
    f.write_text(TINY.read_text().replace("margin: 0.05,\n     alpha: 0.25", "margin: 0.5,\n     alpha: 0.25"))
    edited = load_protocol(f)
    with pytest.raises(RegistrationError) as ei:
        check(edited, reg)
    msg = str(ei.value)
    assert protocol_hash(edited) in msg and e1["sha256"] in msg and "gates[0].margin" in msg
    assert "edited after registration" in msg
    e2 = register(edited, str(f), {"commit": "y"}, reg)  # a new version; the first stays
    assert e2["version"] == 2 and check(edited, reg)["version"] == 2
    with pytest.raises(RegistrationError, match="superseded by version 2"):
        check(p, reg)


def test_an_arm_the_config_loader_refuses_is_refused_with_its_words():
    text = TINY.read_text().replace("{name: restart, policy: restart}", "{name: restart, policy: restart, mode: telepathic}")
    p = parse_protocol(text, "p.yaml")  # the file is well formed ...
    with pytest.raises(ProtocolError) as ei:  # ... but the run config is the loader's to accept
        arm_configs(p)
    assert ei.value.field == "arms[1].mode" and "telepathic" in ei.value.reason and "refused by the run-config loader" \
        in ei.value.reason


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_protocols_parse_and_are_registered(path):
    from studies.registry import REGISTRY

    p = load_protocol(path)
    assert check(p, REGISTRY)["sha256"] == protocol_hash(p), f"{path} changed since registration"


def test_a_fault_past_the_target_is_refused_before_any_run(tmp_path):
    from studies.runner import run_study
    from chaos.reach import ScenarioBeyondRun

    p = parse_protocol(TINY.read_text().replace("at_useful_tokens: 12288", "at_useful_tokens: 99999"), "p.yaml")
    with pytest.raises(ScenarioBeyondRun, match="99,999"):
        run_study(p, {"version": 1, "sha256": protocol_hash(p)}, tmp_path / "s", say=lambda _m: None)
    assert not (tmp_path / "s" / "ledger.jsonl").exists()
