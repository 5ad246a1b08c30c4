"""The study artifact: everything the study page shows, as one JSON document validated against
studies/study.schema.json. Built from the protocol, its registry entry and the ledger only.

Sections: study (name, question, claim, registered hash and revision), protocol (canonical form),
runs (every run record with its directory, hashes and metrics), pairs (per stratum: treatment,
control, difference per metric, the NLL difference beside the noise floor), medians per arm,
intervals (paired bootstrap, description only), trajectory (median held-out NLL over opportunity
ticks per arm), gates (the frozen decision), invalidators, controls, learning (baselines verdict),
conclusion, versions (earlier registered versions with hashes and conclusions), provenance.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from studies.protocol import run_config_dict
from studies.protocol_model import ENERGY_METRICS, Protocol, Stratum
from studies.runner import check_controls, run_keys
from studies.stats import bootstrap_interval, conclusion, decide_gate

KIND = "xdc-study/1"
SCHEMA = Path(__file__).resolve().parent / "study.schema.json"
LEARNING_METRICS = ("final_heldout_nll", "progress_per_flop")


def _val(metrics: dict[str, Any], name: str) -> float | None:
    v = (metrics.get(name) or {}).get("value")
    return None if v is None else float(v)


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _invalidators(p: Protocol, runs: list[dict[str, Any]], mixed: bool) -> list[dict[str, Any]]:
    main = [r for r in runs if not r["control"]]
    checks: dict[str, list[str]] = {
        "unclean_exit": [r["key"] for r in runs if not r["record"].get("clean_exit")],
        "target_not_reached": [r["key"] for r in runs
                               if (r["record"].get("useful_tokens") or 0) < p.target_useful_tokens],
        "work_unbalanced": [r["key"] for r in runs if not r["record"].get("work_balanced")],
        "faults_never_fired": [r["key"] for r in main if r["record"].get("faults_never_fired")],
        "mixed_code_revisions": ["runs were made at more than one code revision"] if mixed else [],
        "eval_set_mismatch": (["runs name different evaluation sets"]
                              if len({r["record"].get("eval_set") for r in runs}) > 1 else []),
    }
    by_stratum: dict[str, set[int]] = {}
    for r in main:
        by_stratum.setdefault(r["stratum"], set()).add(int(r["record"].get("useful_tokens") or 0))
    checks["unequal_work"] = [f"{s}: useful tokens {sorted(v)}" for s, v in by_stratum.items() if len(v) > 1]
    # A meter whose frozen validity rules fired withdraws the energy claims of the whole study (its numbers
    # stay as diagnostics); a machine without a meter fires nothing: its energy gates are `unknown`.
    checks["energy_meter_invalid"] = [f"{r['key']}: {', '.join(r['record']['energy']['invalidators_fired'])}"
                                      for r in runs if (r["record"].get("energy") or {}).get("meter")
                                      and r["record"]["energy"].get("invalidators_fired")]
    checks["start_state_mismatch"] = _start_state_problems(p, runs)
    return [{"name": n, "fired": bool(checks[n]), "evidence": checks[n][:10]} for n in p.invalidators]


def _start_state_problems(p: Protocol, runs: list[dict[str, Any]]) -> list[str]:
    """With a protocol start state, every run must have been configured with the same one and every site
    incarnation must have logged loading it."""
    if not p.start_state:
        return []
    out = []
    hashes = {(r["record"].get("init_state") or {}).get("manifest_sha256") for r in runs}
    if len(hashes) > 1:
        out.append(f"runs name {len(hashes)} different start states: {sorted(str(h)[:12] for h in hashes)}")
    for r in runs:
        st = r["record"].get("init_state")
        if not st:
            out.append(f"{r['key']}: started from the seeded weights, not the start state")
        elif not st.get("all_loaded"):
            out.append(f"{r['key']}: not every site logged loading {str(st.get('manifest_sha256'))[:12]}: {st.get('loaded')}")
    return out


def _noise_floor(p: Protocol, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The noise-floor record measured for the control arm's learning config, in the first stratum of
    the evaluation split where it ran (`xdc noise-floor --study FILE --arm CONTROL`); else why none."""
    from analysis.learning_refs import match_records, noise_floor_records

    ctl = [r for r in runs if r["arm"] == p.control and not r["control"]]
    ctl = [r for r in ctl if r["split"] == p.evaluation_split] or ctl
    if not ctl:
        return {"evidence": "unavailable", "reason": "no control-arm run"}
    cfg = json.loads((Path(ctl[0]["run_dir"]) / "config.json").read_text()) if Path(ctl[0]["run_dir"]).is_dir() \
        else None
    return match_records(noise_floor_records(), ctl[0]["record"].get("dataset_id"), cfg,
                         ctl[0]["record"].get("eval_set"))


def _learning(runs: list[dict[str, Any]]) -> dict[str, str]:
    from analysis.learning import verdict

    return verdict([{"policy": r["key"], "final_nll": r["record"].get("final_heldout_nll"),
                     "baselines": r["record"].get("baselines") or {}} for r in runs])


def _one_sided(one_sided: list[str]) -> str:
    return (f"; in {len(one_sided)} pair(s) one run ended short of the bigram baseline and the other did not: "
            f"{', '.join(one_sided)} (a measured difference, counted)") if one_sided else ""


def _pair_learning(evalpairs: list[dict[str, Any]], runs_by_key: dict[str, dict[str, Any]],
                   exclude: bool = False) -> dict[str, Any]:
    """The learning verdict a learning gate reads: a pair says nothing about learning only when *both* its
    runs ended short of the bigram baseline (two models that learned little). A pair where only one did
    is a measured difference (that run learned less) and counts as one; the study-wide verdict
    (`_learning`) still describes every run. exclude: the pairs with no learning are left out of the
    gate (named in `excluded`) instead of making it vacuous."""
    from analysis.learning import verdict

    empty, one_sided = [], []
    for q in evalpairs:
        t, c = runs_by_key.get(q["treatment_key"]), runs_by_key.get(q["control_key"])
        if t is None or c is None:
            continue
        st = [_learning([r])["status"] for r in (t, c)]
        if "unavailable" in st:
            return _learning([t, c])
        if all(x != "learned" for x in st):
            empty.append(q["stratum"])
        elif any(x != "learned" for x in st):
            one_sided.append(f"{q['stratum']} ({'treatment' if st[0] != 'learned' else 'control'})")
    if empty:
        runs = [runs_by_key[q[k]] for q in evalpairs if q["stratum"] in empty for k in ("treatment_key", "control_key")]
        if exclude:
            return {"status": "learned", "excluded": empty, "text": f"{len(empty)} of {len(evalpairs)} pairs "
                    f"({', '.join(empty)}) left out: both runs ended short of the bigram baseline (the protocol's "
                    "evaluation.unlearned_pairs: exclude)" + _one_sided(one_sided)}
        v = verdict([{"policy": r["key"], "final_nll": r["record"].get("final_heldout_nll"),
                      "baselines": r["record"].get("baselines") or {}} for r in runs])
        return {"status": v["status"], "text": f"in {len(empty)} of {len(evalpairs)} pairs ({', '.join(empty)}) both "
                                               f"runs ended short of learning: {v['text']}"}
    return {"status": "learned", "text": f"no pair has both its runs short of the bigram baseline{_one_sided(one_sided)}"}


def _trajectory(p: Protocol, runs: list[dict[str, Any]]) -> dict[str, list[dict[str, float]]]:
    """Per arm, the median over strata of (ticks, held-out NLL) at each evaluation index."""
    out: dict[str, list[dict[str, float]]] = {}
    for a in p.arms:
        curves = [(r["record"].get("curve_ticks") or [], [c["heldout_nll"] for c in r["record"].get(
            "heldout_nll_curve") or []]) for r in runs if r["arm"] == a.name and not r["control"]]
        n = min((len(n) for _, n in curves), default=0)
        out[a.name] = [{"tick": float(statistics.median(t[k] for t, _ in curves)),
                        "heldout_nll": float(statistics.median(v[k] for _, v in curves))} for k in range(n)]
    return out


def _run_entries(keys: list[tuple[str, Stratum, str, bool]], finished: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per finished run, in the protocol's run order."""
    runs = []
    for key, s, arm, with_faults in keys:
        f = finished.get(key)
        if f is None:
            continue
        rec = {k: v for k, v in f["record"].items()}
        runs.append({"key": key, "stratum": s.name, "arm": arm, "control": not with_faults, "split": s.split,
                     "family": s.family, "run_dir": f["run_dir"], "hashes": f["hashes"], "metrics": f["metrics"],
                     "record": rec, "code_revision": f.get("code_revision")})
    return runs


def choose_control(p: Protocol, runs: list[dict[str, Any]]) -> tuple[Protocol, dict[str, Any] | None]:
    """Apply the protocol's comparator rule (studies/protocol.py `Comparator`) to the finished runs:
    the candidate with the best median metric over the rule's split (runs with faults only), ties to
    the earlier candidate. Returns the protocol with that control, and the record of the choice
    (None when the control is named). Undecided (a candidate lacks runs or values on that split):
    the first candidate stays, and the record says why; the study then states no claim."""
    cmp = p.comparator
    if cmp is None:
        return p, None
    from dataclasses import replace

    n_strata = sum(1 for s in p.strata if s.split == cmp.split)
    vals = {a: [_val(r["metrics"], cmp.metric) for r in runs
                if r["arm"] == a and not r["control"] and r["split"] == cmp.split] for a in cmp.choose_from}
    med = {a: _median(v) for a, v in vals.items()}
    short = [a for a in cmp.choose_from if len(vals[a]) < n_strata or any(x is None for x in vals[a])]
    rec: dict[str, Any] = {"rule": cmp.to_dict(), "medians": med, "runs": {a: len(v) for a, v in vals.items()},
                           "strata": n_strata}
    if short:
        return p, {**rec, "status": "undecided", "chosen": None,
                   "reason": f"{', '.join(short)} {'lacks' if len(short) == 1 else 'lack'} a {cmp.metric} value for "
                             f"some of the {n_strata} {cmp.split} strata"}
    sign = 1.0 if cmp.direction == "lower" else -1.0
    chosen = min(cmp.choose_from, key=lambda a: (sign * med[a], cmp.choose_from.index(a)))  # type: ignore[operator]
    why = (f"the {cmp.direction} median {cmp.metric} over the {n_strata} {cmp.split} strata: "
           + ", ".join(f"{a} {med[a]:.4g}" for a in cmp.choose_from))
    return replace(p, control=chosen), {**rec, "status": "chosen", "chosen": chosen, "reason": why}


def _pairs(p: Protocol, by: dict[tuple[str, str], dict[str, Any]], floor: dict[str, Any]) -> list[dict[str, Any]]:
    """One exact pair (treatment vs control) per stratum where both arms finished, with every metric's
    difference and ratio and the NLL difference against the noise floor."""
    pairs = []
    for s in p.strata:
        t, c = by.get((s.name, p.treatment)), by.get((s.name, p.control))
        if t is None or c is None:
            continue
        vals = {}
        for m in p.metrics:
            tv, cv = _val(t["metrics"], m), _val(c["metrics"], m)
            vals[m] = {"treatment": tv, "control": cv,
                       "difference": None if tv is None or cv is None else tv - cv,
                       "ratio": None if tv is None or not cv else tv / cv,
                       "evidence": (t["metrics"].get(m) or {}).get("evidence", "unavailable")}
        d_nll = vals.get("final_heldout_nll", {}).get("difference")
        if floor.get("evidence") == "measured" and d_nll is not None:
            fv = "within the noise floor" if abs(d_nll) <= floor["threshold_nats"] else "beyond the noise floor"
        else:
            fv = "noise floor not measured for this config"
        pairs.append({"stratum": s.name, "split": s.split, "family": s.family, "region": dict(s.region),
                      "seed": s.seed, "data_order": s.data_order, "faults": s.faults_source,
                      "treatment_key": t["key"], "control_key": c["key"], "values": vals, "nll_vs_noise_floor": fv})
    return pairs


def _gates(p: Protocol, evalpairs: list[dict[str, Any]], learning: dict[str, str],
           by: dict[tuple[str, str], dict[str, Any]] | None = None,
           runs_by_key: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every registered gate decided over the evaluation split's pairs, or, for a gate on a named
    contrast, over the evaluation split's blocks (studies/factorial.py)."""
    from studies.factorial import block_values

    blocks = [s.name for s in p.strata if s.split == p.evaluation_split]
    gates = []
    for g in p.gates:
        gd = {"name": g.name, "metric": g.metric, "kind": g.kind, "direction": g.direction, "margin": g.margin,
              "alpha": g.alpha, "test": g.test, "note": g.note, "relative": g.relative}
        if g.contrast:
            c = p.contrast(g.contrast)
            rows = block_values(c.weights, g.metric, blocks, by or {}, relative=g.relative)
            diffs = [r["value"] for r in rows]  # a block missing an arm's value: the gate is `unknown`
            gd.update(contrast=c.name, weights=dict(c.weights))
        elif g.relative:  # treatment / control - 1: the margin is a fraction of the control's value
            diffs = [None if q["values"][g.metric]["ratio"] is None else q["values"][g.metric]["ratio"] - 1
                     for q in evalpairs]
        else:
            diffs = [q["values"][g.metric]["difference"] for q in evalpairs]
        is_learning = g.metric in LEARNING_METRICS
        # A contrast gate spans blocks of several arms: the study-wide verdict applies to it.
        lv = (_pair_learning(evalpairs, runs_by_key, p.unlearned_pairs == "exclude")
              if is_learning and not g.contrast and runs_by_key is not None else learning)
        left_out = set(lv.get("excluded") or ())
        if left_out:
            diffs = [v for q, v in zip(evalpairs, diffs) if q["stratum"] not in left_out]
        gate = decide_gate(gd, diffs, learning_status=lv["status"] if is_learning else None,
                           learning_text=lv["text"] if is_learning else "")
        if is_learning and lv is not learning:
            gate["learning_pairs"] = lv["text"]
        if left_out:
            gate["excluded_pairs"] = sorted(left_out)
            if not diffs:
                gate.update(status="unknown", reason=f"every pair left out ({', '.join(sorted(left_out))}): both runs "
                                                     "of each ended short of the bigram baseline")
            elif gate.get("cannot_pass"):  # too few pairs left to decide: not a failure of the treatment
                gate.update(status="unknown", reason=f"{gate['reason']}; with {len(left_out)} pair(s) left out "
                                                     f"({', '.join(sorted(left_out))}) too few remain to decide")
        gates.append(gate)
    return gates


def build_artifact(p: Protocol, entry: dict[str, Any], finished: dict[str, dict[str, Any]],
                   earlier: list[dict[str, Any]], study_dir: Path, notes: list[str] | None = None) -> dict[str, Any]:
    keys = run_keys(p)
    split_of = {s.name: s for s in p.strata}
    runs = _run_entries(keys, finished)
    revs = {json.dumps(r["code_revision"], sort_keys=True) for r in runs}
    mixed = len(revs) > 1
    complete = all(k in finished for k, *_ in keys)
    p, comparator = choose_control(p, runs)
    by = {(r["stratum"], r["arm"]): r for r in runs if not r["control"]}
    floor = _noise_floor(p, runs)
    pairs = _pairs(p, by, floor)
    evalpairs = [q for q in pairs if q["split"] == p.evaluation_split]
    learning = _learning([r for r in runs if not r["control"] and split_of[r["stratum"]].split == p.evaluation_split])
    gates = _gates(p, evalpairs, learning, by, {r["key"]: r for r in runs if not r["control"]})
    intervals = {m: {**bootstrap_interval([q["values"][m]["difference"] for q in evalpairs
                                           if q["values"][m]["difference"] is not None]),
                     "what": f"{p.treatment} - {p.control}, mean over {p.evaluation_split} pairs (description only)"}
                 for m in p.metrics}
    medians = {a.name: {m: _median([_val(r["metrics"], m) for r in runs if r["arm"] == a.name and not r["control"]
                                    and r["split"] == p.evaluation_split]) for m in p.metrics} for a in p.arms}
    inval = _invalidators(p, runs, mixed)
    controls = check_controls(p, finished)
    fired = [f"{i['name']}: {', '.join(map(str, i['evidence'][:2]))}" for i in inval if i["fired"]]
    fired += [f"no-failure control {c['stratum']} {c['reason']}" for c in controls if c["status"] == "fail"]
    if comparator is not None and comparator["status"] != "chosen":
        fired.append(f"the comparator is undecided: {comparator['reason']}")
    concl = conclusion(gates, p.claim, fired) if complete else {
        "status": "incomplete", "claim_stated": False,
        "text": f"The study is incomplete: {len(runs)} of {len(keys)} runs finished; no decision yet."}
    cfg0 = run_config_dict(p, p.strata[0], p.arm(p.control))
    from studies.families import family_tables

    families = family_tables(list(p.strata), [a.name for a in p.arms], p.treatment, p.control, runs,
                             floor["threshold_nats"] if floor.get("evidence") == "measured" else None)
    return {
        "kind": KIND,
        "study": {"name": p.name, "question": p.question, "claim": p.claim, "version": entry["version"],
                  "declared_version": p.version, "sha256": entry["sha256"], "registered_utc": entry.get("registered_utc"),
                  "registered_code_revision": entry.get("code_revision"), "protocol_file": entry.get("file"),
                  "treatment": p.treatment, "control": p.control, "evaluation_split": p.evaluation_split,
                  "target_useful_tokens": p.target_useful_tokens, "directory": str(Path(study_dir).resolve()),
                  "complete": complete, "n_runs_planned": len(keys), "n_runs_finished": len(runs),
                  **({"comparator": comparator} if comparator is not None else {})},
        "protocol": p.to_dict(),
        "runs": runs,
        "pairs": pairs,
        "medians": medians,
        "intervals": intervals,
        "trajectory": _trajectory(p, runs),
        "gates": gates,
        "invalidators": inval,
        "controls": controls,
        "learning": learning,
        "noise_floor": floor,
        # the registration's own check of every gate (studies/decidability.py, with the pilot it found)
        **({"decidability": entry["decidability"]} if entry.get("decidability") else {}),
        "conclusion": concl,
        "versions": earlier,
        "families": families,
        **({"factorial": _factorial(p, by)} if p.contrasts else {}),
        **({"energy_report": _energy_report(p, runs)} if any(m in p.metrics for m in ENERGY_METRICS[1:]) else {}),
        **({"start_state": _start_state(p, finished)} if p.start_state else {}),
        "provenance": {"code_revisions": [json.loads(r) for r in sorted(revs)], "mixed_code_revisions": mixed,
                       "notes": list(notes or []), "example_run_config": cfg0,
                       "evidence_classes": {"measured": "read from the run's logs or counters",
                                            "modeled": "a stated formula over measured counts",
                                            "logical": "a count of logged events (opportunity ticks)",
                                            "unavailable": "not measured, with the reason"}},
    }


def _factorial(p: Protocol, by: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    from studies.factorial import contrast_table

    blocks = [s.name for s in p.strata if s.split == p.evaluation_split]
    return {"blocks": blocks, "arms": [a.name for a in p.arms],
            "contrasts": [{"name": c.name, "weights": dict(c.weights), "note": c.note} for c in p.contrasts],
            "table": contrast_table(p.contrasts, p.metrics, blocks, by)}


def _energy_report(p: Protocol, runs: list[dict[str, Any]]) -> dict[str, Any]:
    from studies.energy_report import energy_summary

    inv = ((p.base_config.get("telemetry") or {}).get("invalidators") or {})
    return energy_summary({"runs": runs}, p.treatment, [s.name for s in p.strata if s.split == p.evaluation_split],
                          int(inv.get("counter_min_updates_per_phase", 3)))


def _start_state(p: Protocol, finished: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from studies.start_state import START_KEY, resolved

    st = resolved(p, finished)
    run = finished.get(START_KEY)
    return {"declared": dict(p.start_state or {}), "resolved": st,
            "run": None if run is None else {"run_dir": run["run_dir"], "hashes": run["hashes"]}}


def validate(art: dict[str, Any]) -> None:
    import jsonschema

    jsonschema.validate(art, json.loads(SCHEMA.read_text()))
