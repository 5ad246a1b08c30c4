"""The paired-difference floor (studies/paired_floor.py) and what it lets registration decide
(studies/decidability.py), and the learning gate read pair by pair (studies/artifact.py): pure, no runs.
The numbers of the v3 pilots are the ones issue 51's v4/v7 registrations were checked against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.artifact import _pair_learning
from studies.decidability import check_gate, refusal
from studies.paired_floor import find_record, gate_pilot, record_from_artifact, robust_sd, sign_flip_p, write_record
from studies.stats import sign_flip_p as scipy_sign_flip_p

ROOT = Path(__file__).resolve().parents[2]
NLL_GATE = {"name": "learning", "metric": "final_heldout_nll", "kind": "noninferiority", "direction": "lower",
            "margin": 0.03, "alpha": 0.05}
# equal-work v3's six paired NLL differences (adaptive - fixed-local, nats), from its published artifact
EW_V3 = [-0.0344, -0.0335, -0.0151, -0.0015, -0.0058, -0.0700]


def _artifact(diffs: dict[str, list[float]], version: int = 3) -> dict:
    n = len(next(iter(diffs.values())))
    pairs = [{"stratum": f"s{i}", "split": "heldout", "treatment_key": f"s{i}/t", "control_key": f"s{i}/c",
              "values": {m: {"difference": d[i], "ratio": 1.0 + d[i] / 2.0, "evidence": "measured"}
                         for m, d in diffs.items()}} for i in range(n)]
    return {"study": {"name": "st", "version": version, "evaluation_split": "heldout"},
            "protocol": {"contrast": {"treatment": "t", "control": "c"}}, "pairs": pairs,
            "runs": [{"code_revision": {"commit": "abc"}}]}


def test_the_exact_sign_flip_p_matches_scipys():
    for x in ([0.03, -0.01, 0.02, 0.04, -0.015, 0.025], [0.01] * 6, [-0.02, 0.0, 0.0, 0.01], EW_V3):
        assert sign_flip_p(x) == pytest.approx(scipy_sign_flip_p(x)["p"])
    assert sign_flip_p([0.01] * 6) == 1 / 64 and sign_flip_p([]) == 1.0


def test_robust_sd_is_mad_scaled_and_falls_back_to_the_sd():
    assert robust_sd([1.0, 2.0, 3.0, 4.0, 100.0]) == pytest.approx(1.4826)  # the outlier barely moves it
    assert robust_sd([0.0, 0.0, 0.0, 1.0]) == pytest.approx(0.5)  # MAD 0: the sample sd
    assert robust_sd([5.0]) == 0.0


def test_a_record_from_an_artifact_keeps_each_metrics_differences_and_is_found_for_the_next_version(tmp_path):
    art = _artifact({"final_heldout_nll": EW_V3, "attempted_flops": [0, 0, 0, 0, 0, 5e9]})
    path = tmp_path / "artifact.json"
    path.write_text(json.dumps(art))
    out = write_record(path, tmp_path)
    assert out.name == "paired_floor_st-v3.json"
    rec = json.loads(out.read_text())
    nll = rec["metrics"]["final_heldout_nll"]
    assert nll["differences"] == EW_V3 and nll["robust_sd"] == pytest.approx(0.0212, abs=1e-4)
    assert rec["source"]["treatment"] == "t" and rec["source"]["control"] == "c"
    assert find_record("st", 4, "t", ["c"], tmp_path)["record_file"] == out.name
    assert find_record("st", 3, "t", ["c"], tmp_path) is None  # a pilot is an earlier version only
    assert find_record("st", 4, "other", ["c"], tmp_path) is None


def test_with_the_pilot_a_margin_over_every_difference_cannot_fail_and_one_under_the_pairs_cannot_pass():
    rec = {**record_from_artifact(_artifact({"final_heldout_nll": EW_V3}), "a.json", "0" * 64), "record_file": "f"}
    pilot = gate_pilot(NLL_GATE, rec)
    assert pilot["oriented"][0] == pytest.approx(0.0344)  # lower is better: a negative difference is a win
    ok = check_gate(NLL_GATE, 6, None, pilot)
    assert ok["decides"] and ok["pilot"]["worst_case_p"] == pytest.approx(27 / 64)
    wide = check_gate({**NLL_GATE, "margin": 0.08}, 6, None, gate_pilot({**NLL_GATE, "margin": 0.08}, rec))
    assert wide["can_fail"] is False and "would come out vacuous" in wide["reason"]
    narrow = check_gate({**NLL_GATE, "margin": 0.01}, 6, None, gate_pilot({**NLL_GATE, "margin": 0.01}, rec))
    assert narrow["can_pass"] is False and "the pairs cannot resolve it" in narrow["reason"]
    # the pilot overrides the seed floor (0.057 nats between two seeds: a paired margin of 0.03 is fine)
    seed = {"evidence": "measured", "threshold_nats": 0.057, "mean_nll": 2.3}
    assert check_gate(NLL_GATE, 6, seed, pilot)["decides"] and not check_gate(NLL_GATE, 6, seed)["decides"]


def test_a_metric_the_arms_never_differ_in_cannot_pass_a_superiority_gate():
    flops = {"name": "flops-saved", "metric": "attempted_flops", "kind": "superiority", "direction": "lower",
             "margin": 0, "alpha": 0.05}
    rec = {**record_from_artifact(_artifact({"attempted_flops": [0, 0, 0, 0, 0, 5e9]}), "a", "0"), "record_file": "f"}
    c = check_gate(flops, 6, None, gate_pilot(flops, rec))
    assert c["can_pass"] is False and c["pilot"]["best_case_p"] == 0.5
    assert "cannot pass" in refusal([c]) and "do not differ enough" in refusal([c])


def _run(key: str, nll: float) -> dict:
    base = {"evidence": "measured", "eval_set": "e", "models": {"unigram": {"value": 3.158}, "bigram": {"value": 2.479}}}
    return {"key": key, "record": {"final_heldout_nll": nll, "baselines": base}}


def test_a_learning_gate_is_vacuous_only_where_both_runs_of_a_pair_learned_little():
    pairs = [{"stratum": s, "treatment_key": f"{s}/t", "control_key": f"{s}/c"} for s in ("a", "b")]
    one_sided = {"a/t": _run("a/t", 2.30), "a/c": _run("a/c", 2.31), "b/t": _run("b/t", 2.49), "b/c": _run("b/c", 2.25)}
    v = _pair_learning(pairs, one_sided)
    assert v["status"] == "learned" and "b (treatment)" in v["text"]  # the treatment's loss is a measured loss
    both = {**one_sided, "b/c": _run("b/c", 2.51)}
    v = _pair_learning(pairs, both)
    assert v["status"] == "weak" and "in 1 of 2 pairs (b) both runs" in v["text"]


def test_a_protocol_may_leave_pairs_with_no_learning_out_of_its_learning_gates():
    from studies.artifact import _gates
    from studies.protocol import parse_protocol
    from studies.protocol_model import ProtocolError

    text = """
name: ex
question: q
claim: c
target_useful_tokens: 1024
arms: [{name: c}, {name: t}]
contrast: {treatment: t, control: c}
strata: [{name: a, seed: 1}, {name: b, seed: 2}, {name: d, seed: 3}, {name: e, seed: 4}, {name: f, seed: 5},
         {name: g, seed: 6}]
metrics: [final_heldout_nll]
evaluation: {split: heldout, unlearned_pairs: exclude}
gates: [{name: learning, metric: final_heldout_nll, kind: noninferiority, direction: lower, margin: 0.01, alpha: 0.05}]
"""
    p = parse_protocol(text, "ex.yaml")
    assert p.unlearned_pairs == "exclude" and p.to_dict()["evaluation"]["unlearned_pairs"] == "exclude"
    assert "unlearned_pairs" not in parse_protocol(text.replace(", unlearned_pairs: exclude", ""), "x").to_dict()[
        "evaluation"]  # a protocol without it hashes as before
    with pytest.raises(ProtocolError, match=r"evaluation.unlearned_pairs: 'drop' is not one of \['flag', 'exclude'\]"):
        parse_protocol(text.replace("unlearned_pairs: exclude", "unlearned_pairs: drop"), "ex.yaml")
    nll = {"a": (2.29, 2.31), "b": (2.52, 2.54), "d": (2.285, 2.30), "e": (2.305, 2.30), "f": (2.27, 2.29),
           "g": (2.295, 2.32)}  # (treatment, control): both runs of b ended short of the bigram baseline
    runs = {f"{s}/{arm}": _run(f"{s}/{arm}", v[i]) for s, v in nll.items() for i, arm in enumerate(("t", "c"))}
    pairs = [{"stratum": s, "treatment_key": f"{s}/t", "control_key": f"{s}/c",
              "values": {"final_heldout_nll": {"difference": v[0] - v[1], "ratio": v[0] / v[1]}}} for s, v in nll.items()]
    (g,) = _gates(p, pairs, {"status": "weak", "text": "study-wide"}, {}, runs)
    assert g["excluded_pairs"] == ["b"] and g["n"] == 5 and not g["vacuous"] and g["status"] == "pass"
    assert "1 of 6 pairs (b) left out" in g["learning_pairs"]
    (g,) = _gates(parse_protocol(text.replace(", unlearned_pairs: exclude", ""), "x"), pairs,
                  {"status": "weak", "text": "study-wide"}, {}, runs)
    assert g["vacuous"] and g["n"] == 6 and "excluded_pairs" not in g  # flag: the pair makes the gate vacuous


def test_the_exact_p_of_tiny_differences_is_not_all_ties_and_a_pilot_of_another_size_is_not_used():
    assert sign_flip_p([1e-14] * 6) == 1 / 64  # progress per FLOP differs by ~1e-14 per pair
    rec = {**record_from_artifact(_artifact({"final_heldout_nll": EW_V3}), "a.json", "0" * 64), "record_file": "f"}
    c = check_gate(NLL_GATE, 8, None, gate_pilot(NLL_GATE, rec))
    assert "pilot" not in c and "the pilot has 6 pairs, the protocol 8" in c["reason"]
    c = check_gate(NLL_GATE, 20, None, gate_pilot(NLL_GATE, {**rec, "metrics": {"final_heldout_nll": {
        **rec["metrics"]["final_heldout_nll"], "n": 20, "differences": EW_V3 * 3 + EW_V3[:2]}}}))
    assert "over the 16 an exact check enumerates" in c["reason"]  # said, not a crash


def test_a_pilot_of_other_strata_is_not_found(tmp_path):
    path = tmp_path / "artifact.json"
    path.write_text(json.dumps(_artifact({"final_heldout_nll": EW_V3})))
    write_record(path, tmp_path)
    strata = [f"s{i}" for i in range(6)]
    assert find_record("st", 4, "t", ["c"], tmp_path, strata=strata, split="heldout") is not None
    assert find_record("st", 4, "t", ["c"], tmp_path, strata=strata[:5], split="heldout") is None
    assert find_record("st", 4, "t", ["c"], tmp_path, strata=strata, split="calibration") is None
