"""Whether a gate can decide, checked before the first run: can it pass, and can it fail?

A gate is an exact sign-flip test over the protocol's n pairs at level alpha, with a margin (issue 51):
  - it cannot pass when 2^-n > alpha: the smallest p the test can attain is 2^-n (3 pairs: 0.125);
  - a learning margin under the recipe's measurable difference (the noise floor's threshold,
    `xdc noise-floor --study FILE --arm CONTROL`) cannot be supported: a noninferiority margin there
    claims more than the seeds can resolve, so the gate cannot pass honestly;
  - a margin far above every plausible difference cannot fail: more than PLAUSIBLE_FACTOR times the
    measurable difference for a learning metric, or a relative margin of 100 % or more.
Where no noise floor applies to the gate's metric, the margin checks are `unknown` (said, never
assumed).

With a pilot (studies/paired_floor.py: the paired differences of an earlier published version with
the same arms and strata), the paired design's own numbers decide instead of the seed floor:
  - the measurable difference is the pilot's robust sd of the paired differences (a noninferiority
    margin under it cannot be supported);
  - can it pass: the pilot's difference magnitudes, every one in the treatment's favour, pass the test
    (a metric that never differs between the arms, as attempted FLOPs at equal work, cannot);
  - can it fail: the same magnitudes, every one against the treatment, fail it (else the margin
    swallows every difference the pilot saw: the gate would come out vacuous).
Standard library only: the published page shows this check beside every verdict.
"""

from __future__ import annotations

import math
from typing import Any

from studies.paired_floor import MAX_EXACT_PAIRS, sign_flip_p

# A learning difference this many times the measurable one (the noise floor's threshold, about the 95 %
# band of a difference of two seeds) is beyond anything two arms of one recipe plausibly produce here: the
# whole range from the unigram baseline to kn5 on the evaluation set is about 30 x the demo's threshold.
PLAUSIBLE_FACTOR = 10.0
LN256 = math.log(256)  # nats per byte of a uniform guess: the NLL progress per FLOP counts from
NLL_METRICS = ("final_heldout_nll",)


def metric_floor(metric: str, relative: bool, floor: dict[str, Any] | None) -> tuple[float | None, str]:
    """The measurable difference of a gate's metric in the gate's units, and where it comes from;
    (None, why) where the noise floor says nothing about the metric."""
    if not floor or floor.get("evidence") != "measured" or floor.get("threshold_nats") is None:
        return None, "no noise floor measured for the control arm's recipe"
    thr = float(floor["threshold_nats"])
    if metric in NLL_METRICS:
        if relative:
            return thr / float(floor["mean_nll"]), "noise-floor threshold / mean NLL"
        return thr, "noise-floor threshold (nats)"
    if metric == "progress_per_flop" and relative:
        # progress = (ln 256 - NLL) / FLOPs at equal FLOPs: a relative change of thr / (ln 256 - NLL)
        return thr / (LN256 - float(floor["mean_nll"])), "noise-floor threshold / (ln 256 - mean NLL)"
    return None, f"the noise floor is measured in held-out NLL, not in {metric}"


def _pilot_checks(gate: dict[str, Any], margin: float, alpha: float, pilot: dict[str, Any]) -> dict[str, Any]:
    """The test on the pilot's magnitudes, all for and all against the treatment."""
    mags = [abs(v) for v in pilot["oriented"]]
    best = sign_flip_p([m + margin for m in mags])
    worst = sign_flip_p([margin - m for m in mags])
    return {"best_case_p": best, "worst_case_p": worst, "n": pilot["n"],
            "max_abs_difference": max(mags, default=0.0), "robust_sd": pilot["robust_sd"], "source": pilot["source"]}


def check_gate(gate: dict[str, Any], n_pairs: int, floor: dict[str, Any] | None,
               pilot: dict[str, Any] | None = None) -> dict[str, Any]:
    """{can_pass, can_fail: True | False | None (unknown), decides, reasons, numbers} for one gate.
    pilot: studies.paired_floor.gate_pilot's view of the pilot for this gate, or None."""
    alpha, margin = float(gate["alpha"]), float(gate.get("margin") or 0.0)
    min_p = 2.0 ** -n_pairs if n_pairs > 0 else 1.0
    can_pass: bool | None = True
    can_fail: bool | None = True
    why: list[str] = []
    if n_pairs <= 0:
        can_pass = False
        why.append("no pairs in the evaluation split")
    elif min_p > alpha:
        can_pass = False
        why.append(f"with {n_pairs} pairs the smallest attainable p is 2^-{n_pairs} = {min_p:.4g} > alpha {alpha:g}")
    measurable, source = metric_floor(gate["metric"], bool(gate.get("relative")), floor)
    seed_floor = (measurable, source)
    pilot_out = None
    if pilot is not None and (pilot["n"] != n_pairs or n_pairs > MAX_EXACT_PAIRS):
        why.append(f"no pilot check: the pilot has {pilot['n']} pairs, the protocol {n_pairs}"
                   + (f" (over the {MAX_EXACT_PAIRS} an exact check enumerates)" if n_pairs > MAX_EXACT_PAIRS else ""))
        pilot = None
    if pilot is not None:
        pilot_out = _pilot_checks(gate, margin if gate["kind"] == "noninferiority" else 0.0, alpha, pilot)
        measurable = pilot["robust_sd"] if gate["kind"] == "noninferiority" else None
        source = f"robust sd of the paired differences, {pilot['source']}"
        if pilot_out["best_case_p"] > alpha and can_pass:
            can_pass = False
            why.append(f"the pilot's {pilot['n']} differences, every one in the treatment's favour, give p "
                       f"{pilot_out['best_case_p']:.4g} > alpha {alpha:g} (largest |difference| "
                       f"{pilot_out['max_abs_difference']:.4g}): the arms do not differ enough in this metric to pass")
        if pilot_out["worst_case_p"] <= alpha:
            can_fail = False
            why.append(f"the pilot's {pilot['n']} differences, every one turned against the treatment, still give p "
                       f"{pilot_out['worst_case_p']:.4g} <= alpha {alpha:g} within margin {margin:g} (largest "
                       f"|difference| {pilot_out['max_abs_difference']:.4g}): it would come out vacuous")
    if gate["kind"] == "noninferiority" and not (pilot is not None and measurable == 0.0):
        if gate.get("relative") and margin >= 1.0:
            can_fail = False
            why.append(f"a relative margin of {margin:.0%} lets the treatment be twice as bad or worse: no plausible "
                       "difference fails it")
        if measurable is None:
            can_pass = None if can_pass else can_pass
            can_fail = None if can_fail else can_fail
            why.append(f"margin {margin:g} not checked against a measurable difference: {source}")
        else:
            if margin < measurable:
                can_pass = False
                why.append(f"margin {margin:g} is under the measurable difference {measurable:.4g} ({source}): the "
                           f"{'pairs' if pilot else 'seeds'} cannot resolve it, so noninferiority within it cannot "
                           "be supported")
            if pilot is None and margin > PLAUSIBLE_FACTOR * measurable:  # a pilot answers this directly
                can_fail = False
                why.append(f"margin {margin:g} is more than {PLAUSIBLE_FACTOR:g} x the measurable difference "
                           f"{measurable:.4g} ({source}): no plausible difference exceeds it, so it cannot fail")
    decides = can_pass is not False and can_fail is not False
    return {"gate": gate["name"], "metric": gate["metric"], "n_pairs": n_pairs, "alpha": alpha, "margin": margin,
            "min_attainable_p": min_p, "measurable_difference": measurable, "measurable_source": source,
            "seed_floor_difference": seed_floor[0], "seed_floor_source": seed_floor[1],
            **({"pilot": pilot_out} if pilot_out is not None else {}),
            "can_pass": can_pass, "can_fail": can_fail, "decides": decides,
            "status": "decides" if decides and None not in (can_pass, can_fail) else
                      ("cannot decide" if not decides else "unknown"),
            "reason": "; ".join(why) or (f"can pass (smallest p {min_p:.4g} <= alpha {alpha:g}) and can fail"
                                         + (f" (the pilot's {pilot_out['n']} differences all for the treatment: p "
                                            f"{pilot_out['best_case_p']:.4g}; all against: p "
                                            f"{pilot_out['worst_case_p']:.4g})" if pilot_out else ""))}


def check_protocol(gates: list[dict[str, Any]], n_pairs: int, floor: dict[str, Any] | None,
                   pilot_record: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    from studies.paired_floor import gate_pilot

    return [check_gate(g, n_pairs, floor, gate_pilot(g, pilot_record)) for g in gates]


def refusal(checks: list[dict[str, Any]]) -> str | None:
    """The message that refuses a protocol with a gate that cannot decide (None when every gate can)."""
    bad = [c for c in checks if not c["decides"]]
    if not bad:
        return None
    return "; ".join(f"gate {c['gate']!r} cannot {'pass' if c['can_pass'] is False else 'fail'}: {c['reason']}"
                     for c in bad)
