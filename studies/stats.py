"""Paired statistics of a study: per-stratum differences, exact sign-flip tests, bootstrap intervals,
and the gate decisions. Pure functions over plain lists; scipy does the statistics.

Per stratum i the paired difference is d_i = treatment_i - control_i, in the metric's unit.
A gate says which direction is better for the treatment (`lower` or `higher`); e_i is d_i oriented
so that e_i > 0 means the treatment did better.

  superiority     H0: mean e <= 0        H1: mean e > 0          x_i = e_i
  noninferiority  H0: mean e <= -margin  H1: mean e > -margin    x_i = e_i + margin

The test is scipy.stats.permutation_test on the single sample x with permutation_type='samples'
(every observation's sign flipped independently) and n_resamples=inf, so the null distribution is
all 2^n sign patterns (exact): p = #{patterns with mean >= observed mean} / 2^n. Six positive
pairs give p = 1/64. The gate passes when p <= alpha.

A gate is flagged:
  cannot_pass  1/2^n > alpha: no data of this size could pass it (too few strata);
  vacuous      it would pass under every sign pattern of the observed magnitudes (the margin
               swallows every difference: x_i = margin - |e_i| still passes), so the data at
               hand could not have failed it; for learning gates also when the runs did not get
               clearly past the evaluation set's n-gram baselines (analysis/learning.py verdict
               other than `learned`): a learning difference between models that learned nothing
               says nothing.
A gate with a missing value in any pair (energy with no meter) is `unknown`, with the reason.
The paired bootstrap 90% interval (scipy.stats.bootstrap, percentile, fixed seed) of the mean
difference is description only: it never decides a gate.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from studies.wording import passed_as_written

BOOTSTRAP_LEVEL = 0.90
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20261201


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def sign_flip_p(x: Sequence[float]) -> dict[str, Any]:
    """One-sided (greater) exact sign-flip p of mean(x) > 0 over all 2^n sign patterns."""
    from scipy import stats

    arr = np.asarray(x, dtype=float)
    n = len(arr)
    if n == 0:
        return {"p": None, "n_patterns": 0, "exact": True}
    if n == 1:  # scipy needs two observations; the two patterns are x and -x (a tie counts, as in scipy)
        return {"p": 0.5 if arr[0] > 0 else 1.0, "n_patterns": 2, "exact": True}
    res = stats.permutation_test((arr,), _mean, permutation_type="samples", alternative="greater",
                                 n_resamples=np.inf, vectorized=True)
    n_null = int(np.size(res.null_distribution))
    return {"p": float(res.pvalue), "n_patterns": n_null, "exact": n_null == 2 ** n}


def bootstrap_interval(d: Sequence[float], level: float = BOOTSTRAP_LEVEL) -> dict[str, Any]:
    """Percentile bootstrap interval of the mean paired difference (description only)."""
    from scipy import stats

    arr = np.asarray(d, dtype=float)
    if len(arr) < 2:
        return {"low": None, "high": None, "level": level, "reason": "fewer than 2 pairs"}
    if np.all(arr == arr[0]):
        return {"low": float(arr[0]), "high": float(arr[0]), "level": level, "method": "all pairs equal"}
    res = stats.bootstrap((arr,), np.mean, confidence_level=level, method="percentile",
                          n_resamples=BOOTSTRAP_RESAMPLES, rng=np.random.default_rng(BOOTSTRAP_SEED))
    ci = res.confidence_interval
    return {"low": float(ci.low), "high": float(ci.high), "level": level,
            "method": f"percentile bootstrap, {BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}"}


def oriented(d: Sequence[float], direction: str) -> list[float]:
    """e_i: positive = the treatment did better."""
    return [float(v) if direction == "higher" else -float(v) for v in d]


def decide_gate(gate: dict[str, Any], diffs: Sequence[float | None], *, learning_status: str | None = None,
                learning_text: str = "") -> dict[str, Any]:
    """One gate over the per-stratum differences (treatment - control, metric units).
    gate: {name, metric, kind, direction, margin, alpha}. learning_status: the learning verdict
    of the runs compared (only for learning metrics)."""
    out: dict[str, Any] = {**gate, "n": len(diffs), "p": None, "status": "unknown", "reason": "",
                           "vacuous": False, "vacuous_reason": "", "cannot_pass": False}
    if not diffs:
        return {**out, "reason": "no pairs in the evaluation split"}
    missing = sum(1 for v in diffs if v is None or (isinstance(v, float) and math.isnan(v)))
    if missing:
        return {**out, "reason": f"{missing} of {len(diffs)} pairs have no value for {gate['metric']} "
                                 "(unavailable: see the run records)"}
    d = [float(v) for v in diffs]  # type: ignore[arg-type]
    e = oriented(d, gate["direction"])
    margin = float(gate.get("margin", 0.0)) if gate["kind"] == "noninferiority" else 0.0
    x = [v + margin for v in e]
    test = sign_flip_p(x)
    n = len(d)
    alpha = float(gate["alpha"])
    out.update({"p": test["p"], "n_patterns": test["n_patterns"], "exact": test["exact"],
                "mean_difference": float(np.mean(d)), "median_difference": float(np.median(d)),
                "min_attainable_p": 2.0 ** -n, "interval": bootstrap_interval(d)})
    worst = sign_flip_p([margin - abs(v) for v in e])["p"]
    out["worst_case_p"] = worst
    if 2.0 ** -n > alpha:
        out["cannot_pass"] = True
    if worst is not None and worst <= alpha:
        out["vacuous"] = True
        out["vacuous_reason"] = (f"it passes even with every difference turned against the treatment "
                                 f"(worst-case p {worst:.4g} <= alpha {alpha:g}): the margin {margin:g} is larger "
                                 "than the differences, so these data could not fail it")
    if learning_status is not None and learning_status != "learned":
        out["vacuous"] = True
        why = f"the runs did not get clearly past the evaluation set's n-gram baselines ({learning_status})"
        out["vacuous_reason"] = "; ".join(r for r in (out["vacuous_reason"], why + (f": {learning_text}" if
                                                                                      learning_text else "")) if r)
    what = (f"treatment noninferior within {margin:g}" if gate["kind"] == "noninferiority"
            else "treatment better")
    if test["p"] <= alpha:
        out["status"] = "pass"
        out["reason"] = f"{what}: exact sign-flip p {test['p']:.4g} <= alpha {alpha:g} over {n} pairs"
    else:
        out["status"] = "fail"
        out["reason"] = f"not shown that {what}: exact sign-flip p {test['p']:.4g} > alpha {alpha:g} over {n} pairs"
        if out["cannot_pass"]:
            out["reason"] += f" (with {n} pairs the smallest attainable p is {2.0 ** -n:.4g}: it could not pass)"
    return out


def conclusion(gates: list[dict[str, Any]], claim: str, invalid: list[str]) -> dict[str, Any]:
    """The claim is stated only when every gate passes, none is vacuous, and no invalidator fired."""
    if invalid:
        return {"status": "invalid", "claim_stated": False,
                "text": f"No claim: {len(invalid)} invalidator(s) fired ({'; '.join(invalid[:3])})."}
    failed = [g for g in gates if g["status"] == "fail"]
    unknown = [g for g in gates if g["status"] == "unknown"]
    vac = [g for g in gates if g["vacuous"]]
    if not failed and not unknown and not vac:
        return {"status": "claim", "claim_stated": True, "text": f"All {len(gates)} gates passed: {claim}"}
    parts = [passed_as_written(gates)]
    if failed:
        parts.append(f"{len(failed)} failed ({', '.join(g['name'] for g in failed)})")
    if unknown:
        parts.append(f"{len(unknown)} unknown ({', '.join(g['name'] for g in unknown)})")
    vac_failed = [g for g in vac if g["status"] != "pass"]  # a vacuous gate that did not pass (rare)
    if vac_failed:
        parts.append(f"{len(vac_failed)} vacuous ({', '.join(g['name'] for g in vac_failed)})")
    return {"status": "no_claim", "claim_stated": False, "text": "The claim is not stated: " + "; ".join(parts) + "."}
