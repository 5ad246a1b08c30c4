"""The study page's energy sections (the seed's "Does saving progress cost energy?" and "What caused
the local GPU-energy penalty?"), from the artifact's runs (their compact energy records,
studies/energy.py) and its factorial contrasts (studies/factorial.py).

Order, as the seed reads: validity before effect size (meters, poll calibration, the frozen
invalidators, the claims); observed arm medians; the no-failure controls; the contrasts (labelled
diagnostic when the claim they would support is withdrawn or was never measured); counter support by
phase; every run record (the ledger); the selected run's phase metrics; its raw point trace, loaded on
demand. `energy_summary` builds the artifact's `energy_report`; `energy_sections` renders it.
"""

from __future__ import annotations

import html
import statistics
from pathlib import Path
from typing import Any

ENERGY_METRICS = ("energy_j", "energy_checkpoint_j", "energy_replay_j")


def _e(v: Any) -> str:
    return html.escape(str(v))


def _f(v: Any, spec: str = ",.3f") -> str:
    return "unavailable" if v is None else (f"{v:,}" if isinstance(v, int) else format(v, spec))


def trace_key(run_id: str) -> str:
    """analysis/energy_report.write_energy_traces' file key for a run id."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)


def _median(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def energy_summary(art: dict[str, Any], treatment: str, blocks: list[str], min_updates: int) -> dict[str, Any]:
    """Validity over all runs, counter support by phase, arm medians (raw numbers kept as diagnostics), and
    the selected run (the treatment arm in the first block) whose phases and trace the page shows."""
    runs = art["runs"]
    main = [r for r in runs if not r["control"]]
    recs = {r["key"]: r["record"].get("energy") or {} for r in runs}
    with_meter = [k for k, e in recs.items() if e.get("meter")]
    fired = {k: e["invalidators_fired"] for k, e in recs.items() if e.get("meter") and e.get("invalidators_fired")}
    reasons = sorted({str(e.get("reason")) for e in recs.values() if not e.get("meter")})
    if not with_meter:
        state, text = "unavailable", ("No energy meter was readable in any run: every measured energy number is "
                                      "unavailable and every energy gate unknown. " + "; ".join(reasons[:2]))
    elif fired:
        state, text = "invalid", (f"The measuring stick failed: frozen invalidators fired in {len(fired)} of "
                                  f"{len(runs)} runs; the energy claims are withdrawn and every energy number below "
                                  "is a diagnostic.")
    else:
        state, text = "valid", f"No frozen invalidator fired in any of the {len(runs)} runs: the energy claims stand."
    support: dict[str, dict[str, Any]] = {}
    for r in main:
        for ph in (recs[r["key"]].get("phases") or []):
            s = support.setdefault(ph["phase"], {"phase": ph["phase"], "runs": 0, "duration_s": 0.0, "updates": [],
                                                 "modeled_updates": [], "claims": set()})
            s["runs"] += 1
            s["duration_s"] += ph.get("duration_s") or 0.0
            s["updates"].append(ph.get("counter_updates"))
            s["modeled_updates"].append(ph.get("modeled_updates"))
            s["claims"].add(ph.get("claim"))
    sup_rows = []
    for s in support.values():
        ups = [u for u in s["updates"] if u is not None]
        sup_rows.append({"phase": s["phase"], "runs": s["runs"], "duration_s": s["duration_s"],
                         "counter_updates_median": _median(ups), "counter_updates_min": min(ups) if ups else None,
                         "runs_below_minimum": sum(1 for u in ups if u < min_updates) if ups else None,
                         "modeled_updates_median": _median(s["modeled_updates"]),
                         "claims": sorted(str(c) for c in s["claims"]), "minimum": min_updates,
                         "supported": bool(ups) and all(u >= min_updates for u in ups)})
    arms = list(dict.fromkeys(r["arm"] for r in main))
    medians = {a: {m: {"value": _median([(r["metrics"].get(m) or {}).get("value") for r in main if r["arm"] == a]),
                       "diagnostic": _median([(r["metrics"].get(m) or {}).get("diagnostic_value") for r in main
                                              if r["arm"] == a]),
                       "evidence": next(((r["metrics"].get(m) or {}).get("evidence") for r in main if r["arm"] == a),
                                        "unavailable")}
                   for m in ENERGY_METRICS}
               | {"modeled_j": {"value": _median([recs[r["key"]].get("run_modeled_j") for r in main if r["arm"] == a]),
                                "evidence": "modeled"}}
               for a in arms}
    sel = next((r for r in main if r["arm"] == treatment and r["stratum"] == (blocks or [""])[0]), main[0] if main else None)
    return {"state": state, "text": text, "runs_with_meter": len(with_meter), "runs": len(runs), "fired": fired,
            "unavailable_reasons": reasons, "support": sup_rows, "medians": medians,
            "selected_run": None if sel is None else {"key": sel["key"], "run_dir": sel["run_dir"],
                                                      "trace_key": trace_key(str(sel["record"].get("run_id") or "")),
                                                      "phases": recs[sel["key"]].get("phases") or [],
                                                      "trace_sha256": recs[sel["key"]].get("trace_sha256")}}


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    h = "".join(f"<th>{_e(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _ev(cls: str) -> str:
    return f"<span class='ev'>{_e(cls)}</span>"


def _q(v: Any, diag: Any, evidence: str) -> str:
    if v is not None:
        return f"{_f(v)} J{_ev(evidence)}"
    if diag is not None:
        return f"{_f(diag)} J <i>(diagnostic)</i>{_ev('unavailable')}"
    return f"unavailable{_ev('unavailable')}"


def energy_sections(art: dict[str, Any]) -> str:
    from analysis.energy_report import ENERGY_TRACE_JS

    er = art.get("energy_report")
    if not er:
        return ""
    out = [f"<section id='energy-validity' data-energy-state='{_e(er['state'])}'><h2>Energy: validity before effect "
           f"size</h2><p class='answer'>{_e(er['text'])}</p>"]
    rows = []
    for r in art["runs"]:
        e = r["record"].get("energy") or {}
        poll = e.get("poll") or {}
        run_claim = next((c for c in e.get("claims", []) if c["claim"] == "run_energy"), {})
        rows.append([_e(r["key"]), _e(e.get("meter") or "none"),
                     f"{_f(poll.get('achieved_rate_hz'), '.1f')} Hz of {_f(poll.get('target_rate_hz'), '.1f')}",
                     _f(poll.get("interval_p95_ms"), ".1f"), _f(e.get("effective_update_period_ms"), ".1f"),
                     _e(", ".join(e.get("invalidators_fired") or []) or "none"),
                     _e(f"{run_claim.get('status', 'unavailable')}: {run_claim.get('reason', e.get('reason', ''))}")])
    out.append(_table(["Run", "Meter", "Achieved poll rate", "Poll interval p95 (ms)", "Counter effective update (ms)",
                       "Invalidators fired", "Run-energy claim"], rows, "energy-validity") + "</section>")
    arms = list(er["medians"])
    rows = [[_e(m)] + [_q(er["medians"][a][m]["value"], er["medians"][a][m].get("diagnostic"),
                          er["medians"][a][m]["evidence"]) for a in arms] for m in (*ENERGY_METRICS, "modeled_j")]
    out.append("<section id='energy-medians'><h2>Observed arm medians</h2><p>Median over the blocks; a modeled "
               "number (CPU seconds x a declared W per core) never passes an energy gate.</p>"
               + _table(["Quantity", *arms], rows, "energy-medians") + "</section>")
    rows = [[_e(c["stratum"]), f"<span class='{_e(c['status'])}'>{_e(c['status'])}</span>", _e(c["reason"])]
            for c in art["controls"]]
    out.append("<section id='energy-controls'><h2>No-failure controls</h2><p>Without a failure, cadence and "
               "continuation must not change the computation: state hash, work and final NLL must match exactly.</p>"
               + (_table(["Block", "Status", "State, work, final NLL"], rows) if rows else "<p>None asked for.</p>")
               + "</section>")
    fac = art.get("factorial") or {}
    gates = {(g.get("contrast"), g["metric"]): g for g in art["gates"] if g.get("contrast")}
    rows = []
    for t in fac.get("table", []):
        g = gates.get((t["contrast"], t["metric"]))
        if t["n_with_value"]:
            val = f"{_f(t['mean'], '.4g')} (positive in {t['positive_blocks']} of {t['n']} blocks)"
        elif t.get("diagnostic"):
            val = f"{_f(t['diagnostic']['mean'], '.4g')} <i>diagnostic</i>: {_e(t['diagnostic']['label'])}"
        else:
            val = "unavailable"
        rows.append([_e(t["contrast"]), _e(t["metric"]), val,
                     _e(f"{g['name']}: {g['status']}") if g else "no gate"])
    weights = "; ".join(f"{c['name']} = " + " ".join(f"{w:+d}·{a}" for a, w in c["weights"].items())
                        for c in fac.get("contrasts", []))
    label = "" if er["state"] == "valid" else (" Energy contrasts are diagnostic here: "
                                               + ("no meter was readable." if er["state"] == "unavailable"
                                                  else "the meter's invalidators fired."))
    out.append(f"<section id='energy-contrasts'><h2>Contrasts per block</h2><p>{_e(weights)}. Mean over blocks; the "
               f"gates use the exact sign-flip test over all 2<sup>n</sup> sign patterns.{_e(label)}</p>"
               + _table(["Contrast", "Metric", "Mean (blocks)", "Gate"], rows, "energy-contrasts") + "</section>")
    rows = [[_e(s["phase"]), str(s["runs"]), _f(s["duration_s"], ",.1f"), _f(s["counter_updates_median"], ".1f"),
             _f(s["counter_updates_min"]), _f(s["runs_below_minimum"]), _f(s["modeled_updates_median"], ".1f"),
             _e(", ".join(s["claims"])), "yes" if s["supported"] else "no"] for s in er["support"]]
    out.append(f"<section id='energy-support'><h2>Counter support by phase</h2><p>Counter updates inside each phase's "
               f"time, over the runs (a phase's energy needs at least {er['support'][0]['minimum'] if er['support'] else 3}"
               " per run).</p>" + _table(["Phase", "Runs", "Duration (s)", "Counter updates (median)", "Min",
                                          "Runs below the minimum", "Modeled-meter updates (median)", "Claims",
                                          "Supported"], rows, "energy-support") + "</section>")
    rows = []
    for r in art["runs"]:
        rec, e = r["record"], r["record"].get("energy") or {}
        m = r["metrics"].get("energy_j") or {}
        rows.append([_e(r["key"]), _e(r["stratum"]), _e(r["arm"]),
                     f"{_f(rec.get('attempted_tokens'))} / {_f(rec.get('useful_tokens'))}",
                     _f(rec.get("final_heldout_nll"), ".4f"), f"{_f(e.get('polls'))} / {_f(e.get('counter_updates'))}",
                     _q(m.get("value"), m.get("diagnostic_value"), m.get("evidence", "unavailable")),
                     f"{_f(e.get('run_modeled_j'), ',.1f')} J{_ev('modeled')}", _f(rec.get("checkpoints")),
                     f"<span class='mono'>{_e(e.get('trace_sha256'))}</span>"])
    out.append("<section id='energy-ledger'><h2>All run records</h2>" + _table(
        ["Run", "Block", "Arm", "Attempted / canonical tokens", "Final NLL", "Polls / counter updates", "Run energy",
         "Modeled energy", "Checkpoints", "Trace SHA-256"], rows, "energy-ledger") + "</section>")
    sel = er.get("selected_run")
    if sel:
        rows = [[_e(p["phase"]), _e(p.get("claim")), _f(p.get("duration_s"), ",.2f"),
                 _q(p.get("energy_j"), None, p.get("energy_evidence", "unavailable")),
                 f"{_f(p.get('energy_modeled_j'), ',.2f')} J{_ev('modeled')}", _f(p.get("counter_updates")),
                 _f(p.get("effective_update_equivalents"), ".1f"), _f(p.get("idle_subtracted_j"))]
                for p in sel["phases"]]
        k = sel["trace_key"]
        out.append(f"<section id='energy-phases'><h2>Selected-run phase metrics: {_e(sel['key'])}</h2>"
                   + _table(["Phase", "Claim", "Duration (s)", "Energy", "Modeled energy", "Counter updates",
                             "Effective update equivalents", "Idle-subtracted (sensitivity)"], rows, "energy-phases")
                   + f"<script>{ENERGY_TRACE_JS}</script><div class='trace' id='etrace-{_e(k)}'><button type='button' "
                   f"data-src='energy_traces/{_e(k)}.js' onclick='xdcLoadStudyTrace(this)'>Load the raw telemetry "
                   f"trace</button> <span class='trace-status'>not loaded</span> (SHA-256 <span class='mono'>"
                   f"{_e(sel.get('trace_sha256'))}</span>)<table hidden><thead><tr></tr></thead><tbody></tbody>"
                   "</table></div></section>")
    return "".join(out)


def write_energy_trace(art: dict[str, Any], out_dir: Path) -> None:
    """The selected run's raw point trace as energy_traces/<key>.js (point, time, phase at timestamp, values)."""
    from analysis.energy_report import write_energy_traces
    from analysis.load import load_run

    sel = (art.get("energy_report") or {}).get("selected_run")
    if not sel or not Path(sel["run_dir"], "logs").is_dir():
        return
    write_energy_traces([load_run(Path(sel["run_dir"]))], art, out_dir)
