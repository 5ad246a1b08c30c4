"""The study artifact and page from a synthetic ledger (pure: no runs): pairs, gates, the family
ledger with its rankings and abstentions, schema validation, every section rendered."""

from __future__ import annotations

from studies.artifact import build_artifact, validate
from studies.protocol import parse_protocol
from studies.report import render

PROTO = """
name: fam
question: Does t beat c?
claim: t is noninferior to c.
target_useful_tokens: 1024
arms: [{name: c}, {name: t}, {name: s, mode: sync}]
contrast: {treatment: t, control: c}
strata:
  - {name: cal, family: calm, split: calibration}
  - {name: p-mild, family: partition, region: {latency: mid}, seed: 1}
  - {name: p-severe, family: partition, region: {latency: high}, seed: 2}
  - {name: q-mild, family: squeeze, region: {bandwidth: mid}, seed: 3}
  - {name: q-severe, family: squeeze, region: {bandwidth: low}, seed: 4}
metrics: [final_heldout_nll, opportunity_ticks, energy_j]
gates:
  - {name: learning, metric: final_heldout_nll, kind: noninferiority, direction: lower, margin: 0.05, alpha: 0.25}
"""
NLL = {  # stratum -> arm -> final NLL: t wins both partition regions; squeeze flips
    "cal": {"c": 2.5, "t": 2.5, "s": 2.6},
    "p-mild": {"c": 2.6, "t": 2.4, "s": 2.7}, "p-severe": {"c": 2.9, "t": 2.5, "s": 2.8},
    "q-mild": {"c": 2.5, "t": 2.52, "s": 2.45}, "q-severe": {"c": 2.7, "t": 2.6, "s": 2.9},
}


def _finished(p):
    out = {}
    for s in p.strata:
        for a in p.arms:
            nll = NLL[s.name][a.name]
            base = {"dataset_id": "d", "eval_set": "e", "baselines": {"evidence": "unavailable", "reason": "synthetic"}}
            out[f"{s.name}/{a.name}"] = {
                "key": f"{s.name}/{a.name}", "run_dir": f"/nonexistent/{s.name}-{a.name}", "code_revision": {"commit": "x"},
                "hashes": {"config_sha256": "0" * 64, "summary_sha256": "1" * 64, "logs_sha256": "2" * 64},
                "metrics": {"final_heldout_nll": {"value": nll, "unit": "nats/token", "evidence": "measured"},
                            "opportunity_ticks": {"value": 20 if a.name == "t" else 24, "unit": "ticks",
                                                  "evidence": "logical"},
                            "energy_j": {"value": None, "unit": "J", "evidence": "unavailable", "reason": "no meter"}},
                "record": {"useful_tokens": 1024, "attempted_tokens": 1024, "final_heldout_nll": nll,
                           "state_hash": "h", "checkpoints": 1, "clean_exit": True, "work_balanced": True,
                           "faults_never_fired": 0, "heldout_nll_curve": [{"heldout_nll": nll + 1}, {"heldout_nll": nll}],
                           "curve_ticks": [10, 20], **base}}
    return out


def test_artifact_pairs_gates_families_and_page():
    p = parse_protocol(PROTO, "fam.yaml")
    entry = {"version": 2, "sha256": "a" * 64, "registered_utc": "now", "code_revision": {"commit": "x"}}
    earlier = [{"version": 1, "sha256": "b" * 64, "conclusion": "No claim: 1 failed", "artifact_path": "old.json"}]
    art = build_artifact(p, entry, _finished(p), earlier, __import__("pathlib").Path("/tmp"))
    validate(art)
    assert art["study"]["complete"] and len(art["pairs"]) == 5
    (g,) = art["gates"]
    assert g["n"] == 4 and g["n_patterns"] == 16  # the four held-out pairs only
    assert g["vacuous"] and "n-gram" in g["vacuous_reason"]  # no baselines: learning proves nothing
    assert not art["conclusion"]["claim_stated"]
    fam = {f["family"]: f for f in art["families"]["ledger"]}
    assert set(fam) == {"calm", "partition", "squeeze"}
    # no noise floor for this config: every family abstains and says why, none vanishes into a median
    assert all(f["ranking"] == "abstains" and "noise floor" in f["reason"] for f in fam.values())
    assert fam["partition"]["learning_delta"] < 0 and fam["partition"]["completion_ratio"] == 20 / 24
    assert fam["squeeze"]["ranking_flips"] and not fam["partition"]["ranking_flips"]
    regions = {r["stratum"]: r for r in art["families"]["regions"]}
    assert regions["q-mild"]["hindsight_best"] == "s" and regions["q-severe"]["hindsight_best"] == "t"
    assert art["trajectory"]["t"] == [{"tick": 10.0, "heldout_nll": 3.5}, {"tick": 20.0, "heldout_nll": 2.5}]
    page = render(art)
    for sec in ("headline", "medians", "trajectory-section", "intervals", "decision", "pairs", "families", "runs",
                "versions", "provenance"):
        assert f"<section id='{sec}'" in page, sec
    assert "b" * 64 in page and "No claim: 1 failed" in page  # the earlier version, with hash and conclusion


def test_families_rank_when_the_noise_floor_is_known():
    from studies.families import family_tables

    p = parse_protocol(PROTO, "fam.yaml")
    f = _finished(p)
    runs = [{"stratum": k.split("/")[0], "arm": k.split("/")[1], "control": False, **v} for k, v in f.items()]
    t = family_tables(list(p.strata), ["c", "t", "s"], "t", "c", runs, floor_nats=0.05)
    fam = {x["family"]: x for x in t["ledger"]}
    assert fam["partition"]["ranking"] == "t wins"
    assert fam["squeeze"]["ranking"] == "abstains"  # +0.02 inside the floor in one region
    assert fam["calm"]["ranking"] == "abstains"
    # the stated saving (20 % of ticks or bytes) counts held-out families only; 20/24 ticks is a 17 % saving
    assert (t["saving_goal"]["n_heldout"], t["saving_goal"]["n_saving"]) == (2, 0)
    assert not fam["partition"]["saves_goal"] and fam["partition"]["completion_ratio"] == 20 / 24
    runs = [{**r, "metrics": {**r["metrics"], "inter_site_bytes": {  # t sends a tenth of the bytes in partition
                "value": 1.0 if (r["arm"] == "t" and r["stratum"].startswith("p-")) else 10.0}}} for r in runs]
    t = family_tables(list(p.strata), ["c", "t", "s"], "t", "c", runs, floor_nats=0.05)
    assert t["saving_goal"]["families"] == ["partition"], t["ledger"]


def _with_rule(metric: str = "final_heldout_nll", direction: str = "lower", split: str = "calibration") -> str:
    return PROTO.replace("contrast: {treatment: t, control: c}",
                         "contrast: {treatment: t, control: {choose_from: [c, s], split: " + split
                         + f", metric: {metric}, direction: {direction}}}}}")


def test_the_comparator_is_chosen_by_the_frozen_rule_from_calibration_runs_only():
    """The control named by a rule: c has the lower NLL on the one calibration stratum (2.5 vs 2.6),
    although s wins a held-out region (q-mild): the held-out runs cannot choose it. The choice and its
    reason are in the artifact and on the page, and every pair is against c."""
    p = parse_protocol(_with_rule(), "fam.yaml")
    assert p.control == "c" and p.comparator is not None
    entry = {"version": 1, "sha256": "a" * 64, "registered_utc": "now", "code_revision": {"commit": "x"}}
    fin = _finished(p)
    art = build_artifact(p, entry, fin, [], __import__("pathlib").Path("/tmp"))
    validate(art)
    cmp = art["study"]["comparator"]
    assert (cmp["status"], cmp["chosen"], cmp["medians"], cmp["strata"]) == ("chosen", "c", {"c": 2.5, "s": 2.6}, 1)
    assert art["study"]["control"] == "c"
    assert "lower median final_heldout_nll over the 1 calibration strata: c 2.5, s 2.6" in cmp["reason"]
    assert "id='comparator'" in render(art)
    # The same rule with `higher` picks s, and then every pair is t against s.
    p2 = parse_protocol(_with_rule(direction="higher"), "fam.yaml")
    art2 = build_artifact(p2, entry, _finished(p2), [], __import__("pathlib").Path("/tmp"))
    assert art2["study"]["comparator"]["chosen"] == "s" and art2["study"]["control"] == "s"
    q = next(x for x in art2["pairs"] if x["stratum"] == "q-mild")
    assert q["values"]["final_heldout_nll"]["control"] == 2.45
    # A candidate without its calibration run: undecided, and the study states no claim.
    fin3 = {k: v for k, v in _finished(p).items() if k != "cal/s"}
    art3 = build_artifact(p, entry, fin3, [], __import__("pathlib").Path("/tmp"))
    assert art3["study"]["comparator"]["status"] == "undecided" and not art3["conclusion"]["claim_stated"]


def test_a_comparator_rule_is_checked_like_every_other_field():
    import pytest

    from studies.protocol import ProtocolError

    with pytest.raises(ProtocolError, match=r"contrast\.control\.split: the comparator must be chosen on another split"):
        parse_protocol(_with_rule(split="heldout"), "fam.yaml")
    with pytest.raises(ProtocolError, match=r"contrast\.control\.metric: 'wall_s' is not one of"):
        parse_protocol(_with_rule(metric="wall_s"), "fam.yaml")
    with pytest.raises(ProtocolError, match=r"contrast\.control\.choose_from: the treatment 't' cannot be"):
        parse_protocol(PROTO.replace("contrast: {treatment: t, control: c}", "contrast: {treatment: t, control: "
                                     "{choose_from: [c, t], split: calibration, metric: final_heldout_nll, "
                                     "direction: lower}}"), "fam.yaml")
    named = parse_protocol(PROTO, "fam.yaml")
    assert named.comparator is None and named.to_dict()["contrast"] == {"treatment": "t", "control": "c"}
