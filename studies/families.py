"""Stress families (controller-heldout): the untouched-family ledger and the ranking regions.

A stratum may name a `family` (a seeded generator of scenarios: bandwidth collapse, partition, ...)
and a `region` of infrastructure uncertainty (labels such as bandwidth/latency/failure_rate). For
every family this module reports, without pooling families into one median:

  ledger row   learning delta (median treatment - control final NLL over the family's regions),
               completion ratio (treatment / control opportunity ticks), WAN ratio (inter-site
               bytes), work replayed (treatment's replayed tokens), energy ratio, and a ranking:
               "<treatment> wins" / "<control> wins" when every region's NLL difference has the
               same sign and is beyond the noise floor, else "abstains" with the reason
               (a difference inside the floor, or regions disagreeing).
  region rows  per region: the arms ranked by final NLL, the best whole-policy choice in
               hindsight (the lowest NLL among all arms), and whether the ranking flips
               between the family's regions.

Sampling intervals (studies/stats.py) and these infrastructure regions stay separate: a region is
a labelled condition, never a sample of one distribution.
"""

from __future__ import annotations

import statistics
from typing import Any


# The saving a family must show, stated before controller-heldout v6 ran (issue 51): at least 20 % of
# opportunity ticks or of inter-site bytes. Descriptive, beside the gates (not a gate).
SAVING_GOAL = 0.2


def _v(run: dict[str, Any] | None, metric: str) -> float | None:
    if run is None:
        return None
    x = (run["metrics"].get(metric) or {}).get("value")
    return None if x is None else float(x)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def family_tables(strata: list[Any], arms: list[str], treatment: str, control: str, runs: list[dict[str, Any]],
                  floor_nats: float | None) -> dict[str, Any]:
    by = {(r["stratum"], r["arm"]): r for r in runs if not r["control"]}
    fams: dict[str, list[Any]] = {}
    for s in strata:
        if s.family:
            fams.setdefault(s.family, []).append(s)
    ledger, regions = [], []
    for fam, ss in fams.items():
        deltas, best_arms = [], []
        for s in ss:
            nll = {a: _v(by.get((s.name, a)), "final_heldout_nll") for a in arms}
            ranked = sorted((a for a in arms if nll[a] is not None), key=lambda a: nll[a])  # type: ignore[index]
            best = ranked[0] if ranked else None
            best_arms.append(best)
            t, c = nll.get(treatment), nll.get(control)
            d = None if t is None or c is None else t - c
            deltas.append(d)
            regions.append({"family": fam, "stratum": s.name, "split": s.split, "region": dict(s.region),
                            "ranking": ranked, "hindsight_best": best, "difference_nll": d,
                            "reason": "" if d is not None else "a run of this region did not finish"})
        flips = len({b for b in best_arms if b is not None}) > 1
        for r in regions:
            if r["family"] == fam:
                r["ranking_flips_in_family"] = flips
        known = [d for d in deltas if d is not None]
        t_runs = [by.get((s.name, treatment)) for s in ss]
        c_runs = [by.get((s.name, control)) for s in ss]

        def med_ratio(metric: str) -> float | None:
            rs = [_ratio(_v(t, metric), _v(c, metric)) for t, c in zip(t_runs, c_runs)]
            rs = [x for x in rs if x is not None]
            return statistics.median(rs) if rs else None

        if len(known) < len(deltas) or not known:
            rank, why = "abstains", "not every region has both runs"
        elif floor_nats is None:
            rank, why = "abstains", "no noise floor measured for this config: a difference cannot be told from seed noise"
        elif all(d < -floor_nats for d in known):
            rank, why = f"{treatment} wins", f"lower NLL in every region, beyond the {floor_nats:.4f}-nat floor"
        elif all(d > floor_nats for d in known):
            rank, why = f"{control} wins", f"lower NLL in every region, beyond the {floor_nats:.4f}-nat floor"
        else:
            rank, why = "abstains", "the regions' differences do not all exclude zero by the noise floor"
        split = {s.split for s in ss}
        saving = [r for r in (med_ratio("opportunity_ticks"), med_ratio("inter_site_bytes")) if r is not None]
        ledger.append({"family": fam, "split": "/".join(sorted(split)), "n_regions": len(ss),
                       "learning_delta": statistics.median(known) if known else None,
                       "completion_ratio": med_ratio("opportunity_ticks"), "wan_ratio": med_ratio("inter_site_bytes"),
                       "work_replayed": sum(int(_v(t, "replayed_tokens") or 0) for t in t_runs if t is not None),
                       "energy_ratio": med_ratio("energy_j"), "ranking": rank, "reason": why,
                       "ranking_flips": flips, "saves_goal": bool(saving) and min(saving) <= 1 - SAVING_GOAL})
    held = [f for f in ledger if f["split"] == "heldout"]
    saving = [f["family"] for f in held if f["saves_goal"]]
    return {"ledger": ledger, "regions": regions,
            "saving_goal": {"fraction": SAVING_GOAL, "families": saving, "n_saving": len(saving), "n_heldout": len(held),
                            "rule": f"median ratio of opportunity ticks or of inter-site bytes (treatment / control) "
                                    f"at most {1 - SAVING_GOAL:g} over the family's regions"}}
