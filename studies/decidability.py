"""Whether a gate can decide, checked before the first run: can it pass, and can it fail?

A gate is an exact sign-flip test over the protocol's n pairs at level alpha, with a margin (issue 51):
  - it cannot pass when 2^-n > alpha: the smallest p the test can attain is 2^-n (3 pairs: 0.125);
  - a learning margin under the recipe's measurable difference (the noise floor's threshold,
    `xdc noise-floor --study FILE --arm CONTROL`) cannot be supported: a noninferiority margin there
    claims more than the seeds can resolve, so the gate cannot pass honestly;
  - a margin far above every plausible difference cannot fail: more than PLAUSIBLE_FACTOR times the
    measurable difference for a learning metric, or a relative margin of 100 % or more.
Where no noise floor applies to the gate's metric, the margin checks are `unknown` (said, never
assumed). Standard library only: the published page shows this check beside every verdict.
"""

from __future__ import annotations

import math
from typing import Any

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


def check_gate(gate: dict[str, Any], n_pairs: int, floor: dict[str, Any] | None) -> dict[str, Any]:
    """{can_pass, can_fail: True | False | None (unknown), decides, reasons, numbers} for one gate."""
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
    if gate["kind"] == "noninferiority":
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
                           "seeds cannot resolve it, so noninferiority within it cannot be supported")
            if margin > PLAUSIBLE_FACTOR * measurable:
                can_fail = False
                why.append(f"margin {margin:g} is more than {PLAUSIBLE_FACTOR:g} x the measurable difference "
                           f"{measurable:.4g} ({source}): no plausible difference exceeds it, so it cannot fail")
    decides = can_pass is not False and can_fail is not False
    return {"gate": gate["name"], "metric": gate["metric"], "n_pairs": n_pairs, "alpha": alpha, "margin": margin,
            "min_attainable_p": min_p, "measurable_difference": measurable, "measurable_source": source,
            "can_pass": can_pass, "can_fail": can_fail, "decides": decides,
            "status": "decides" if decides and None not in (can_pass, can_fail) else
                      ("cannot decide" if not decides else "unknown"),
            "reason": "; ".join(why) or (f"can pass (smallest p {min_p:.4g} <= alpha {alpha:g}) and can fail")}


def check_protocol(gates: list[dict[str, Any]], n_pairs: int, floor: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [check_gate(g, n_pairs, floor) for g in gates]


def refusal(checks: list[dict[str, Any]]) -> str | None:
    """The message that refuses a protocol with a gate that cannot decide (None when every gate can)."""
    bad = [c for c in checks if not c["decides"]]
    if not bad:
        return None
    return "; ".join(f"gate {c['gate']!r} cannot {'pass' if c['can_pass'] is False else 'fail'}: {c['reason']}"
                     for c in bad)
