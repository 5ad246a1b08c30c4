"""A gate must be able to decide before the first run (issue 51): unit tests of studies/decidability.py
against a noise floor (a gate that can both pass and fail, and one that cannot, named with its numbers).
The real `xdc study register`: tests/live/test_study_decidability.py."""

from __future__ import annotations

from studies.decidability import check_gate, refusal
FLOOR = {"evidence": "measured", "threshold_nats": 0.0555, "mean_nll": 2.05}
NLL_GATE = {"name": "learning", "metric": "final_heldout_nll", "kind": "noninferiority", "margin": 0.1, "alpha": 0.05}


def test_three_pairs_at_alpha_5_percent_cannot_pass():
    c = check_gate(NLL_GATE, 3, FLOOR)
    assert (c["can_pass"], c["decides"], c["status"]) == (False, False, "cannot decide")
    assert "2^-3 = 0.125 > alpha 0.05" in c["reason"]


def test_a_margin_of_ten_nats_cannot_fail_and_one_under_the_floor_cannot_pass():
    c = check_gate({**NLL_GATE, "margin": 10.0}, 6, FLOOR)
    assert (c["can_pass"], c["can_fail"]) == (True, False) and "no plausible difference exceeds it" in c["reason"]
    c = check_gate({**NLL_GATE, "margin": 0.05}, 6, FLOOR)
    assert (c["can_pass"], c["can_fail"]) == (False, True) and "under the measurable difference 0.0555" in c["reason"]
    assert "cannot pass" in refusal([c])


def test_a_gate_the_noise_floor_says_nothing_about_is_unknown_not_refused():
    c = check_gate({"name": "bytes", "metric": "inter_site_bytes", "kind": "noninferiority", "margin": 0.1,
                    "alpha": 0.05, "relative": True}, 6, FLOOR)
    assert c["status"] == "unknown" and c["decides"] and refusal([c]) is None
    c = check_gate({"name": "ticks", "metric": "opportunity_ticks", "kind": "superiority", "margin": 0, "alpha": 0.05},
                   6, FLOOR)
    assert c["status"] == "decides"
    c = check_gate(NLL_GATE, 6, FLOOR)
    assert c["status"] == "decides" and c["measurable_difference"] == 0.0555
