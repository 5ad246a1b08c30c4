"""The study statistics against known values (pure functions; scipy does the arithmetic)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from studies.stats import bootstrap_interval, conclusion, decide_gate, sign_flip_p

NI = {"name": "learning", "metric": "final_heldout_nll", "kind": "noninferiority", "direction": "lower",
      "margin": 0.02, "alpha": 0.05}


def test_six_positive_pairs_give_one_sided_p_of_one_in_64_over_all_sign_patterns():
    r = sign_flip_p([0.3, 0.1, 0.2, 0.05, 0.4, 0.25])
    assert r["p"] == pytest.approx(1 / 64) and r["n_patterns"] == 64 and r["exact"]


def test_sign_flip_p_is_the_exact_enumeration():
    x = [0.3, -0.1, 0.2, 0.05, -0.4, 0.25, 0.12]
    obs = np.mean(x)
    count = sum(1 for s in itertools.product((1, -1), repeat=len(x)) if np.mean(np.multiply(s, x)) >= obs - 1e-12)
    r = sign_flip_p(x)
    assert r["n_patterns"] == 2 ** len(x) and r["p"] == pytest.approx(count / 2 ** len(x))


def test_a_noninferiority_gate_passes_fails_and_names_why():
    # treatment NLL lower in all six pairs: a clear pass at p = 1/64
    g = decide_gate(NI, [-0.03, -0.01, -0.02, -0.04, -0.015, -0.025], learning_status="learned")
    assert g["status"] == "pass" and g["p"] == pytest.approx(1 / 64) and not g["vacuous"]
    # treatment worse by more than the margin everywhere: fails
    g = decide_gate(NI, [0.05, 0.06, 0.04, 0.07, 0.05, 0.08], learning_status="learned")
    assert g["status"] == "fail" and g["p"] == pytest.approx(1.0) and "p 1 > alpha" in g["reason"]


def test_a_margin_that_makes_the_gate_unfailable_is_flagged_vacuous():
    # margin 5 nats against differences of a few hundredths: passes even with every sign flipped
    g = decide_gate({**NI, "margin": 5.0}, [0.03, -0.01, 0.02, 0.04, -0.015, 0.025], learning_status="learned")
    assert g["status"] == "pass" and g["vacuous"] and "could not fail" in g["vacuous_reason"]
    # the sensible margin on the same data is not vacuous
    g = decide_gate(NI, [0.03, -0.01, 0.02, 0.04, -0.015, 0.025], learning_status="learned")
    assert not g["vacuous"]


def test_a_learning_gate_is_vacuous_when_the_runs_did_not_pass_the_ngram_baselines():
    g = decide_gate(NI, [-0.03, -0.01, -0.02, -0.04, -0.015, -0.025], learning_status="weak",
                    learning_text="ended between the unigram and bigram baselines")
    assert g["status"] == "pass" and g["vacuous"] and "n-gram baselines" in g["vacuous_reason"]


def test_too_few_pairs_cannot_pass_and_missing_values_are_unknown():
    g = decide_gate(NI, [-0.1, -0.2], learning_status="learned")  # smallest p = 1/4 > 0.05
    assert g["status"] == "fail" and g["cannot_pass"] and "could not pass" in g["reason"]
    g = decide_gate({**NI, "metric": "energy_j"}, [None, None])
    assert g["status"] == "unknown" and "unavailable" in g["reason"]


def test_higher_is_better_superiority():
    g = decide_gate({"name": "ppf", "metric": "progress_per_flop", "kind": "superiority", "direction": "higher",
                     "margin": 0, "alpha": 0.05}, [1e-12, 2e-12, 3e-12, 1e-12, 2e-12, 5e-13], learning_status="learned")
    assert g["status"] == "pass" and g["p"] == pytest.approx(1 / 64)


def test_bootstrap_interval_is_description_and_reproducible():
    d = [0.1, 0.2, 0.3, 0.05, 0.4, 0.2]
    a, b = bootstrap_interval(d), bootstrap_interval(d)
    assert a == b and a["level"] == 0.9 and min(d) <= a["low"] < a["high"] <= max(d)


def test_a_claim_is_stated_only_when_every_gate_passes():
    ok = decide_gate(NI, [-0.03, -0.01, -0.02, -0.04, -0.015, -0.025], learning_status="learned")
    bad = decide_gate(NI, [0.05, 0.06, 0.04, 0.07, 0.05, 0.08], learning_status="learned")
    assert conclusion([ok], "X holds", [])["claim_stated"]
    c = conclusion([ok, {**bad, "name": "b"}], "X holds", [])
    assert not c["claim_stated"] and "1 failed (b)" in c["text"]
    assert conclusion([ok], "X holds", ["unclean_exit: s0/a"])["status"] == "invalid"
