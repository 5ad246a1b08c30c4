"""Reading a run's held-out NLL against the count baselines of the same evaluation set.

Role in xdc: the sites log `eval` spans (heldout_nll, heldout_nll_se, eval_set, eval_tokens) and the
launcher logs one `baselines` event (unigram, bigram and Kneser-Ney NLL fitted on the training
split, on the same eval set). `run_baselines` pairs the two from a run's logs, refusing baselines
that were measured on other windows; `verdict` turns final NLLs + baselines into the report's
words. Pure functions over plain dicts: the artifact and the report both call them.

Wording rules of `verdict` (strict comparisons against each run's own baselines):
  unavailable  no final NLL, no baselines (older logs), or runs on different eval sets
  no_learning  a run's final NLL >= the unigram baseline: "... never passed the unigram baseline:
               no learning comparison is possible."
  weak         every run < unigram, some >= bigram: "... ended between the unigram and bigram
               baselines: ... differences between policies say little about learning."
  learned      every run < bigram: "The runs ended N nats below the bigram baseline ..." (N, or
               the range N1-N2 over runs), plus where the best run sits against the n-gram baseline.
"""

from __future__ import annotations

from typing import Any

UNIT = "nats/token"


def run_baselines(baseline_events: list[dict[str, Any]], eval_events: list[dict[str, Any]]) -> dict[str, Any]:
    """The baselines that apply to a run's NLL curve, as measured quantities, or why there are none.

    baseline_events: the run's `baselines` events (the launcher logs one); eval_events: its `eval`
    spans. Returns {"evidence": "measured", "eval_set", "dataset_id", "eval_tokens", "event_id",
    "models": {name: {"value", "unit", "evidence", "se", "model"}}} or
    {"evidence": "unavailable", "reason"}.
    """
    if not baseline_events:
        return {"evidence": "unavailable", "reason": "no baselines event in the logs (the run predates them)"}
    ev = baseline_events[-1]
    if "error" in ev or not ev.get("baselines"):
        return {"evidence": "unavailable", "reason": f"the baselines could not be computed: {ev.get('error')}"}
    sets = {e.get("eval_set") for e in eval_events}
    if None in sets:
        return {"evidence": "unavailable",
                "reason": "the eval events do not name their evaluation set (older logs): the baselines cannot "
                          "be matched to the windows the NLL was measured on"}
    if sets and sets != {ev.get("eval_set")}:
        return {"evidence": "unavailable",
                "reason": f"the baselines were computed on evaluation set {str(ev.get('eval_set'))[:12]}, the NLL "
                          f"on {', '.join(sorted(str(s)[:12] for s in sets))}"}
    models = {name: {"value": b["nll"], "unit": UNIT, "evidence": "measured", "se": b.get("nll_se"),
                     "model": b.get("model")} for name, b in ev["baselines"].items()}
    return {"evidence": "measured", "eval_set": ev.get("eval_set"), "dataset_id": ev.get("dataset_id"),
            "eval_tokens": ev.get("eval_tokens"), "fitted_on": ev.get("fitted_on"), "event_id": ev.get("id"),
            "models": models}


def ngram_name(models: dict[str, Any]) -> str | None:
    """The smoothed n-gram's key ("kn5"), if any."""
    return next((k for k in models if k not in ("unigram", "bigram")), None)


def _who(items: list[tuple[str, float]], n: int) -> str:
    if len(items) == n:
        return "The run" if n == 1 else "The runs"
    return f"{len(items)} of {n} runs ({', '.join(p for p, _ in items)})"


def verdict(runs: list[dict[str, Any]]) -> dict[str, str]:
    """{"status", "text"} for runs given as {"policy", "final_nll", "baselines"} (baselines as
    returned by run_baselines). See the module docstring for the rules."""
    finals = [(r["policy"], r["final_nll"]) for r in runs if r.get("final_nll") is not None]
    if not finals:
        return {"status": "unavailable", "text": "No held-out NLL was measured, so there is no learning to compare."}
    missing = [r for r in runs if r.get("baselines", {}).get("evidence") != "measured"]
    if missing:
        return {"status": "unavailable",
                "text": f"Baselines are unavailable ({missing[0].get('baselines', {}).get('reason', 'not logged')}): "
                        "the NLL cannot be read against a trivial model of the same text."}
    if len({r["baselines"]["eval_set"] for r in runs}) > 1:
        return {"status": "unavailable",
                "text": "The runs were evaluated on different evaluation sets: their NLLs are not comparable."}
    m = runs[0]["baselines"]["models"]
    uni, bi = m["unigram"]["value"], m["bigram"]["value"]
    n = len(finals)
    stuck = [(p, v) for p, v in finals if v >= uni]
    if stuck:
        return {"status": "no_learning",
                "text": f"{_who(stuck, n)} never passed the unigram baseline ({uni:.3f} {UNIT}): "
                        "no learning comparison is possible."}
    weak = [(p, v) for p, v in finals if v >= bi]
    if weak:
        return {"status": "weak",
                "text": f"{_who(weak, n)} ended between the unigram ({uni:.3f}) and bigram ({bi:.3f} {UNIT}) "
                        f"baselines: {'it' if len(weak) == 1 else 'they'} learned little beyond byte frequencies, "
                        "so differences between policies "
                        "say little about learning."}
    gaps = sorted(bi - v for _, v in finals)
    span = f"{gaps[0]:.2f}" if f"{gaps[0]:.2f}" == f"{gaps[-1]:.2f}" else f"{gaps[0]:.2f}-{gaps[-1]:.2f}"
    text = f"{_who(finals, n)} ended {span} nats below the bigram baseline ({bi:.3f} {UNIT})."
    ng = ngram_name(m)
    if ng is not None:
        k = m[ng]["value"]
        best = min(v for _, v in finals)
        rel = (f"{best - k:.2f} nats above" if best > k else f"{k - best:.2f} nats below")
        text += f" {'It' if n == 1 else 'The best run'} ended {rel} the {ng} n-gram baseline ({k:.3f})."
    return {"status": "learned", "text": text}


def learning_words(final_nll: float | None, baselines: dict[str, Any] | None) -> str:
    """The final held-out NLL against the run's own count baselines, in one phrase."""
    if final_nll is None:
        return "no held-out NLL was measured"
    models = (baselines or {}).get("models") or {}
    big, uni = (models.get(k, {}).get("value") for k in ("bigram", "unigram"))
    if big is None or uni is None:
        return f"held-out NLL {final_nll:.3f} (no baselines to read it against)"
    where = (f"{big - final_nll:.2f} nats below the bigram baseline" if final_nll < big else
             "between the unigram and bigram baselines: it learned little more than byte frequencies"
             if final_nll < uni else "not below the unigram baseline: it learned nothing")
    return f"held-out NLL {final_nll:.3f}, {where} (bigram {big:.3f}, unigram {uni:.3f})"
