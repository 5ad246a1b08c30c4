"""Factorial contrasts of a study (e.g. the 2 x 2 cadence x continuation design): pure functions.

A contrast is a +/-1 weight vector over arms (studies/protocol.py `Contrast`; weights sum to 0). Per
block (stratum) b its value is

    c_b = sum_a w_a * x_{a,b}                 (x = the metric of arm a's run in block b)

and, for a two-arm contrast with `relative: true`, c_b = x_{+,b} / x_{-,b} - 1. A gate on a contrast
is decided exactly like a paired gate (studies/stats.decide_gate) with the c_b in place of the paired
differences: the exact one-sided sign-flip test over all 2^n sign patterns of the n blocks. For the
2 x 2 with arms dense-replay (DR), dense-continue (DC), sparse-replay (SR), sparse-continue (SC):

    interaction  = -DR + DC + SR - SC = (SR - DR) - (SC - DC): how much more sparse cadence costs when
                   a failure is replayed from the durable frontier than when the survivors continue.

A block with any arm's value missing gives None (the gate is then `unknown`, with the reason). Where
the metric is withheld but a raw number exists (an energy claim withdrawn by a meter invalidator),
the same contrast over the raw numbers is kept beside it as `diagnostic`, never as the value.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence


def contrast_value(weights: Mapping[str, int], x: Mapping[str, float | None], relative: bool = False) -> float | None:
    """sum_a w_a x_a (or x_plus / x_minus - 1 for a relative two-arm contrast); None if any x_a is missing."""
    vals = {a: x.get(a) for a in weights}
    if any(v is None for v in vals.values()):
        return None
    if relative:
        (plus,) = [a for a, w in weights.items() if w > 0]
        (minus,) = [a for a, w in weights.items() if w < 0]
        return None if not vals[minus] else float(vals[plus]) / float(vals[minus]) - 1.0  # type: ignore[arg-type]
    return float(sum(w * float(vals[a]) for a, w in weights.items()))  # type: ignore[arg-type]


def _metric(run: Mapping[str, Any] | None, metric: str, diagnostic: bool) -> float | None:
    if run is None:
        return None
    q = (run.get("metrics") or {}).get(metric) or {}
    v = q.get("value")
    if v is None and diagnostic:
        v = q.get("diagnostic_value")
    return None if v is None else float(v)


def block_values(weights: Mapping[str, int], metric: str, blocks: Sequence[str],
                 by: Mapping[tuple[str, str], Mapping[str, Any]], relative: bool = False,
                 diagnostic: bool = False) -> list[dict[str, Any]]:
    """Per block: each arm's value and the contrast's (by: (stratum, arm) -> run entry with `metrics`)."""
    out = []
    for b in blocks:
        x = {a: _metric(by.get((b, a)), metric, diagnostic) for a in weights}
        out.append({"block": b, "arms": x, "value": contrast_value(weights, x, relative)})
    return out


def summarize(values: Sequence[float | None]) -> dict[str, Any]:
    v = [x for x in values if x is not None]
    return {"n": len(values), "n_with_value": len(v), "mean": statistics.fmean(v) if v else None,
            "median": statistics.median(v) if v else None, "positive_blocks": sum(1 for x in v if x > 0)}


def contrast_table(contrasts: Sequence[Any], metrics: Sequence[str], blocks: Sequence[str],
                   by: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every contrast on every metric over the blocks: values, summary, and the diagnostic version over raw
    numbers where the metric is withheld (labelled; it decides nothing)."""
    out = []
    for c in contrasts:
        for m in metrics:
            rows = block_values(c.weights, m, blocks, by)
            row: dict[str, Any] = {"contrast": c.name, "weights": dict(c.weights), "metric": m, "blocks": rows,
                                   **summarize([r["value"] for r in rows])}
            if any(r["value"] is None for r in rows):
                diag = block_values(c.weights, m, blocks, by, diagnostic=True)
                if any(r["value"] is not None for r in diag):
                    row["diagnostic"] = {"blocks": diag, **summarize([r["value"] for r in diag]),
                                         "label": "diagnostic: raw numbers whose claim was withdrawn or not "
                                                  "measured; they decide no gate"}
            out.append(row)
    return out
