"""The published page's recovery section: the demo comparison's four policies on one time axis, their
ledgers, and the demo's learning table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xdc.publish import trace_key
from xdc.page_html import cell, e, ev, fmt, qty, table, trace_box


# ---- recovery (the demo comparison) -------------------------------------------------------------

MARK_KINDS = ("failure", "preemption", "restore", "replay", "rejoin")


def _marks(run: dict[str, Any]) -> list[dict[str, Any]]:
    t0 = int(run.get("t0_wall_ns") or 0)
    out = []
    for m in (run.get("timeline") or {}).get("marks") or []:
        ns = m.get("wall_ns") or m.get("start_ns")
        if ns is None:
            continue
        out.append({**m, "t_s": (int(ns) - t0) / 1e9})
    return out


def _timeline_svg(runs: list[dict[str, Any]]) -> str:
    """One row per policy on one time axis (seconds from each run's start): the merged phase spans
    per site as thin bars, the marks as ticks with a title (event id, kind, time)."""
    if not runs:
        return ""
    colors = {"compute": "#9ecae1", "collective": "#3182bd", "state_transfer": "#e6550d", "checkpoint": "#31a354",
              "recovery": "#d62728", "stalled": "#bbbbbb", "idle": "#eeeeee"}
    t_max = max(((r.get("duration") or {}).get("value") or 0) for r in runs) or 1.0
    left, width, row_h = 110, 980, 56
    height = 30 + row_h * len(runs)
    sx = (lambda t: left + width * max(0.0, min(1.0, t / t_max)))
    parts = [f"<svg role='img' aria-label='Recovery timeline of {len(runs)} policies on one time axis' "
             f"width='{left + width + 20}' height='{height}' viewBox='0 0 {left + width + 20} {height}'>"]
    for k in range(0, 11):
        x = left + width * k / 10
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='12' y2='{height - 6}' stroke='#eee'/>"
                     f"<text x='{x:.1f}' y='10' text-anchor='middle'>{t_max * k / 10:.0f} s</text>")
    for i, r in enumerate(runs):
        y = 20 + i * row_h
        t0 = int(r.get("t0_wall_ns") or 0)
        parts.append(f"<text x='4' y='{y + 26}'>{e(r.get('policy'))}</text>")
        sites = list(r.get("sites") or [])
        for span in (r.get("timeline") or {}).get("spans") or []:
            if span["site"] not in sites:
                continue
            j = sites.index(span["site"])
            x0, x1 = sx((span["start_ns"] - t0) / 1e9), sx((span["end_ns"] - t0) / 1e9)
            parts.append(f"<rect x='{x0:.1f}' y='{y + 6 + j * 9}' width='{max(0.5, x1 - x0):.1f}' height='7' "
                         f"fill='{colors.get(span['phase'], '#ccc')}'><title>{e(span['site'])} {e(span['phase'])}"
                         f"</title></rect>")
        for m in _marks(r):
            x = sx(m["t_s"])
            parts.append(f"<line class='mark' x1='{x:.1f}' x2='{x:.1f}' y1='{y + 2}' y2='{y + 40}' stroke='#000' "
                         f"stroke-width='1.5'><title>{e(m.get('kind'))} {e(m.get('site', ''))} at {m['t_s']:.2f} s "
                         f"({e(m.get('event_id', ''))})</title></line>")
    parts.append("</svg>")
    legend = " · ".join(f"<span style='color:{c}'>■</span> {e(k)}" for k, c in colors.items())
    return "".join(parts) + f"<p class='note'>Bars per site (top to bottom: {e(', '.join(runs[0].get('sites') or []))})" \
        f": {legend}; black ticks: marks (failure, preemption, restore, replay, rejoin).</p>"


def recovery_body(res: dict[str, Any]) -> tuple[str, str]:
    art = res["_artifact"]
    runs = art["runs"]
    cmp = art.get("comparison") or {}
    m = {r["policy"]: r["metrics"] for r in runs}
    useful = {(r["metrics"].get("useful_tokens") or {}).get("value") for r in runs}
    lost = ", ".join(f"{e(p)} {fmt((x.get('lost_tokens') or {}).get('value'))}" for p, x in m.items())
    sc = art.get("scenario") or {}
    failed = [c["name"] for c in art.get("checks", []) if c.get("status") == "fail"]
    if res["state"] == "claim":
        sentence = (f"Yes, mechanically: under one outage ({e(sc.get('name'))}) all {len(runs)} policies reached the "
                    f"same durable frontier ({fmt(next(iter(useful)) if len(useful) == 1 else None)} useful tokens, "
                    f"matched-frontier hash proven) and every contract check passed; the work each lost differs "
                    f"(tokens: {lost}).")
    else:
        sentence = (f"No claim: {'the frontiers did not match' if not cmp.get('matched_frontier') else ''}"
                    f"{'; ' if failed and not cmp.get('matched_frontier') else ''}"
                    f"{('checks failed: ' + ', '.join(failed)) if failed else ''}.")
    rows = []
    for r in runs:
        mm = r["metrics"]
        rows.append([e(r["policy"]), qty(mm.get("attempted_tokens")), qty(mm.get("retained_tokens")),
                     qty(mm.get("lost_tokens")), qty(mm.get("replayed_tokens")), qty(mm.get("attempted_flops"), ".3e"),
                     qty(mm.get("active_time"), ",.1f"), qty(mm.get("final_heldout_nll"), ".4f"),
                     f"<td class='mono'>{e(str(r['frontier'].get('hash'))[:12])}</td>"])
    work = table("Work conservation per policy: attempted = retained + lost", [
        "Policy", "Attempted tokens", "Retained tokens", "Lost tokens", "Replayed tokens", "Attempted FLOPs",
        "Active time", "Final held-out NLL", "Frontier"], rows, "work")
    classes = sorted({c for r in runs for c in ((r.get("bytes") or {}).get("by_class") or {})})
    brows = [[e(r["policy"])] + [cell(((r.get("bytes") or {}).get("by_class") or {}).get(c),
                                      (r.get("bytes") or {}).get("evidence"), ",") for c in classes]
             + [cell((r.get("reconciliation") or {}).get("proxy_total"), (r.get("reconciliation") or {}).get("evidence"), ","),
                cell(100 * (r.get("reconciliation") or {}).get("overhead_fraction", float("nan")),
                     (r.get("reconciliation") or {}).get("evidence"), ".3f", "%")] for r in runs]
    nbytes = table("Where the inter-site bytes went: six traffic classes that never overlap (bytes), against "
                   "Toxiproxy's own counters (the difference is ZMTP/CURVE framing no class owns)",
                   ["Policy", *map(e, classes), "Toxiproxy counted", "Framing overhead"], brows, "bytes")
    marks = [[e(r["policy"]), e(mk.get("kind")), e(mk.get("site", "")), cell(round(mk["t_s"], 3), "measured", ",.3f", "s"),
              f"<td class='mono'>{e(mk.get('event_id', ''))}</td>"] for r in runs for mk in _marks(r)]
    marks_t = table("Accessible recovery timeline list", ["Policy", "Mark", "Site", "Time from run start", "Event id"],
                    marks, "marks")
    checks = [[e(c["name"]), f"<td class='{ {'pass': 'pass', 'fail': 'fail'}.get(c['status'], 'unknown')}'>"
               f"{e(c['status'])}</td>", e(c.get("summary") or "")] for c in art.get("checks", [])]
    checks_t = table("Contract checks (pass / fail / unknown)", ["Check", "Status", "Detail"], checks, "checks")
    faults = [[e(f.get("kind")), e(f.get("target")), e(", ".join(f"{k} {v}" for k, v in f.items()
                                                                 if k.startswith("at_") or k == "duration_s"))]
              for f in sc.get("faults") or []]
    scen = (f"<p>Scenario <b>{e(sc.get('name'))}</b>: {e(sc.get('description'))}</p>"
            + table("Scheduled faults", ["Kind", "Target", "When"], faults)) if sc else "<p>No scenario.</p>"
    traces = "".join(trace_box(res, trace_key("comparison", Path(r["run_dir"]).name), f"{r['policy']} ({r['run_id']})")
                     for r in runs)
    body = (scen + "<h3>The same failure, four ways to recover</h3>" + _timeline_svg(runs) + marks_t
            + "<h3>Where the work and the data went</h3>" + work + nbytes + checks_t
            + "<h3>Raw traces, loaded on demand</h3>" + traces)
    return sentence, body


def demo_learning(res: dict[str, Any]) -> str:
    """The demo's learning per policy, with its baselines, single-process reference and noise floor."""
    art = res["_artifact"]
    refs = art.get("learning_refs") or {}
    floor = refs.get("noise_floor") or {}
    ref = refs.get("reference") or {}
    rows = []
    base_names: list[str] = []
    for r in art["runs"]:
        b = ((r.get("learning") or {}).get("baselines") or {}).get("models") or {}
        base_names = base_names or list(b)
        gap = (ref.get("gap_by_policy") or {}).get(r["policy"])
        rows.append([e(r["policy"]), qty(r["metrics"].get("final_heldout_nll"), ".4f"),
                     cell(gap, ref.get("evidence"), "+.4f")]
                    + [cell((b.get(k) or {}).get("value"), (b.get(k) or {}).get("evidence"), ".4f") for k in base_names])
    ftxt = (f"Noise floor of this recipe: a difference under {floor['threshold_nats']:.4f} nats is not measurable "
            f"({floor.get('n_seeds')} seeds, std {floor.get('std_nll', float('nan')):.4f}){ev('measured')}."
            if floor.get("evidence") == "measured" and floor.get("threshold_nats") is not None
            else f"Noise floor: {e(floor.get('reason') or 'not measured for this config')}{ev('unavailable')}.")
    rtxt = (f"Single-process reference on the same samples (no WAN): final held-out NLL "
            f"{fmt(ref.get('final_heldout_nll'), '.4f')}{ev(ref.get('evidence', 'measured'))}."
            if ref.get("final_heldout_nll") is not None else "No single-process reference recorded.")
    diffs = [[e(d.get("a")), e(d.get("b")), cell(d.get("difference_nats"), "measured", "+.4f"), e(d.get("verdict"))]
             for d in refs.get("differences") or []]
    return ("<h3>The demo's four policies: did the model still learn?</h3>"
            + table("Final held-out NLL per policy against the n-gram baselines of the same evaluation set (nats/token)",
                    ["Policy", "Final NLL", "Minus the single-process reference",
                     *[f"{e(k)} baseline" for k in base_names]], rows, "demo-learning")
            + f"<p>{rtxt} {ftxt}</p>"
            + (table("Every pair of policies against the noise floor", ["Policy", "Policy", "Difference", "Verdict"],
                     diffs) if diffs else ""))
