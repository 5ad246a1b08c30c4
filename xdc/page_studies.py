"""The published page's study sections: learning efficiency, equal work and the controller on unseen
families (gates with their decidability, invalidators, runs, evidence, the controller's timeline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ground.setting import ConsistencySetting
from xdc.publish import trace_key
from xdc.page_html import cell, e, ev, fmt, qty, table, trace_box


# ---- studies --------------------------------------------------------------------------------------

def run_metric(run: dict[str, Any], name: str) -> dict[str, Any]:
    return (run.get("metrics") or {}).get(name) or {}


def gates_table(art: dict[str, Any]) -> str:
    from studies.decidability import check_gate

    rows = []
    # the check made at registration (against the seed floor and the pilot's paired differences) where the
    # artifact has it; else recomputed from the artifact's noise floor
    recorded = {c["gate"]: c for c in ((art.get("decidability") or {}).get("gates") or [])}
    for g in art.get("gates", []):
        flags = ("vacuous: " + str(g.get("vacuous_reason"))) if g.get("vacuous") else ""
        if g.get("excluded_pairs"):
            flags = "; ".join(x for x in (flags, "left out: " + ", ".join(g["excluded_pairs"])) if x)
        planned = int(g.get("n") or 0) + len(g.get("excluded_pairs") or [])  # the pairs registration counted
        pre = recorded.get(g["name"]) or check_gate(g, planned, art.get("noise_floor"))
        pairs = fmt(g.get("n")) if planned == g.get("n") else f"{fmt(g.get('n'))} of {planned}"
        rows.append([e(g["name"]), e(g["metric"]), e(f"{g['kind']} ({g['direction']} is better)"), fmt(g.get("margin")),
                     fmt(g.get("alpha")), pairs,
                     f"<td class='{ {'decides': 'pass', 'cannot decide': 'fail'}.get(pre['status'], 'unknown')} "
                     f"precheck'><b>{e(pre['status'])}</b>: {e(pre['reason'])}</td>",
                     fmt(g.get("p"), ".4g"), f"<td class='{e(g['status'])} gate-status'>{e(g['status'])}</td>",
                     e(g.get("reason")), e(flags)])
    return table(f"The frozen decision: {gate_summary(art)}. Beside each verdict, whether the gate could decide at "
                 "all (can pass and can fail with these pairs, alpha and margin, against the control arm's noise "
                 "floor and, where registration had one, a pilot's paired differences; studies/decidability.py)",
                 ["Gate", "Metric", "Kind", "Margin", "Alpha", "Pairs", "Pre-run check", "p", "Status", "Reason",
                  "Flags"], rows, "gates")


def gate_summary(art: dict[str, Any]) -> str:
    from studies.wording import passed_as_written

    gates = art.get("gates", [])
    return (f"{passed_as_written(gates)}; {sum(g['status'] == 'fail' for g in gates)} failed, "
            f"{sum(g['status'] == 'unknown' for g in gates)} unknown")


def invalidators_table(art: dict[str, Any]) -> str:
    rows = [[e(i["name"]), "fired" if i["fired"] else "did not fire", e("; ".join(map(str, i.get("evidence", []))))]
            for i in art.get("invalidators", [])]
    return table("Invalidators (any that fires withdraws the claim)", ["Invalidator", "State", "Evidence"], rows)


def study_runs_table(res: dict[str, Any], caption: str) -> str:
    art = res["_artifact"]
    rows = []
    for r in art["runs"]:
        rec = r["record"]
        rows.append([e(r["key"]), e(r.get("split")), e(r.get("arm")), cell(rec.get("final_heldout_nll"), "measured", ".4f"),
                     f"<td class='num'>{fmt(rec.get('attempted_tokens'))} / {fmt(rec.get('useful_tokens'))}"
                     f"{ev('measured')}</td>", qty(run_metric(r, "attempted_flops"), ".3e"),
                     qty(run_metric(r, "opportunity_ticks"), ",.0f"), qty(run_metric(r, "wall_s"), ",.1f"),
                     qty(run_metric(r, "energy_j"), ",.0f"), cell(rec.get("checkpoints"), "measured", ","),
                     f"<td class='mono'>{e(str((r.get('hashes') or {}).get('logs_sha256'))[:16])}…</td>"])
    return table(caption, ["Run", "Split", "Arm", "Final NLL", "Attempted / canonical tokens", "Attempted FLOPs",
                           "Opportunity ticks", "Active wall time", "Device energy", "Checkpoints", "Logs SHA-256"],
                 rows, "runs")


def study_traces(res: dict[str, Any], limit: int = 2) -> str:
    art = res["_artifact"]
    boxes = []
    for r in art["runs"][:limit]:
        key = trace_key("study", Path(r["run_dir"]).name)
        if (res["_dir"] / "traces" / f"{key}.js").is_file():
            boxes.append(trace_box(res, key, f"{r['key']}"))
    more = len(art["runs"]) - len(boxes)
    return ("<h3>Raw traces, loaded on demand</h3>" + "".join(boxes)
            + (f"<p class='note'>{more} more run traces are in results/{e(res['name'])}/traces/.</p>" if more > 0 else "")
            if boxes else "")


def evidence_block(res: dict[str, Any]) -> str:
    """Assumptions, uncertainty and missing evidence, generated from the study's artifact and its record."""
    art = res["_artifact"]
    st = art["study"]
    n_pairs = len(art.get("pairs", []))
    strata = art.get("protocol", {}).get("strata") or []
    assumptions = [
        f"Paired by stratum ({len(strata)} strata): each pair shares its seed, data order, fault schedule and link "
        "profile, so a difference is the arms' and not the draw's.",
        "The WAN is emulated on one machine (real sockets through Toxiproxy-shaped links), not measured on a real "
        "wide-area network; the sites share the machine's cores.",
        "FLOPs are modeled (a per-token rate measured once by FlopCounterMode times counted tokens); opportunity "
        "ticks are a logical clock counted from the logs, not seconds.",
        f"Every run trains {fmt(st.get('target_useful_tokens'))} useful tokens of the same data set "
        f"({e(str((res.get('provenance') or {}).get('dataset_id'))[:16])}…).",
    ]
    floor = art.get("noise_floor") or {}
    uncertainty = [
        (f"Seed-to-seed noise floor of the control arm: std {floor.get('std_nll', float('nan')):.4f} nats over "
         f"{floor.get('n_seeds')} seeds; a difference under {floor.get('threshold_nats', float('nan')):.4f} nats is "
         "not measurable." if floor.get("evidence") == "measured" else
         f"No noise floor: {e(floor.get('reason') or 'not measured')}."),
        f"Gates use exact sign-flip tests over {n_pairs} pairs: the smallest attainable p is 2^-{n_pairs} = "
        f"{2.0 ** -n_pairs:.4g}." if n_pairs else "No pairs: no gate could be decided.",
    ]
    for metric, iv in sorted((art.get("intervals") or {}).items()):
        if iv.get("low") is not None:
            uncertainty.append(f"{e(metric)}: paired {int(100 * iv.get('level', 0.9))} % bootstrap interval of the "
                               f"mean difference [{iv['low']:.4g}, {iv['high']:.4g}] (description only).")
    missing = []
    for metric in art.get("protocol", {}).get("metrics", []):
        have = [r for r in art["runs"] if ((r.get("metrics") or {}).get(metric) or {}).get("value") is not None]
        if not have:
            why = next((((r.get("metrics") or {}).get(metric) or {}).get("reason") for r in art["runs"]
                        if ((r.get("metrics") or {}).get(metric) or {}).get("reason")), "no run has a value")
            missing.append(f"{e(metric)}: unavailable in every run ({e(str(why).split(':', 1)[0])}).")
    missing += [f"Gate {e(g['name'])} is unknown: {e(g.get('reason'))}." for g in art.get("gates", [])
                if g["status"] == "unknown"]
    missing += [f"Gate {e(g['name'])} is vacuous: these data could not have failed it." for g in art.get("gates", [])
                if g.get("vacuous")]
    missing += [f"Invalidator {e(i['name'])} fired: {e('; '.join(map(str, i.get('evidence', []))))}."
                for i in art.get("invalidators", []) if i.get("fired")]
    proto = (res.get("provenance") or {}).get("protocol") or {}
    if proto and not proto.get("registration_clean"):
        missing.append("The protocol was registered from a dirty tree: that it was frozen before the runs is not "
                       "provable from the history.")
    lists = "".join(f"<h4>{title}</h4><ul>" + "".join(f"<li>{x}</li>" for x in items or ["None recorded."]) + "</ul>"
                    for title, items in (("Assumptions", assumptions), ("Uncertainty", uncertainty),
                                         ("Missing evidence", missing)))
    return f"<h3>Assumptions, uncertainty, and missing evidence</h3>{lists}"


def learning_body(res: dict[str, Any]) -> tuple[str, str]:
    art = res["_artifact"]
    st = art["study"]
    t, c = st["treatment"], st["control"]
    rows = []
    for q in art.get("pairs", []):
        v = (q.get("values") or {}).get("progress_per_flop") or {}
        rows.append([e(q["stratum"]), e(q.get("split")), cell(v.get("control"), "modeled", ".4e"),
                     cell(v.get("treatment"), "modeled", ".4e"), cell(v.get("difference"), "modeled", "+.3e"),
                     e(q.get("nll_vs_noise_floor"))])
    strata = table(f"Exact paired evaluations: progress per FLOP (nats/FLOP), {e(t)} − {e(c)}",
                   ["Stratum", "Split", f"{e(c)} progress/FLOP", f"{e(t)} progress/FLOP", f"{e(t)} − {e(c)}",
                    "NLL difference vs noise floor"], rows, "strata")
    sentence = study_sentence(res)
    body = (f"<p>{e(st.get('question'))} Same {fmt(st.get('target_useful_tokens'))} useful tokens per run; paired by "
            f"stratum; difference = <b>{e(t)}</b> − <b>{e(c)}</b>. Progress per FLOP is modeled (a measured NLL drop "
            f"over FLOPs counted as a measured rate times tokens). Learning check: {e(art.get('learning', {}).get('text'))}"
            "</p>" + _noise_floor_p(art) + gates_table(art) + invalidators_table(art) + strata
            + _svg_trajectory(art) + evidence_block(res) + study_runs_table(res, "Run-level measurements")
            + _versions(art) + study_traces(res))
    return sentence, body


def study_sentence(res: dict[str, Any]) -> str:
    """The state word, then the study's own conclusion (without its opening words where they repeat the state)."""
    text = str(res["_artifact"]["conclusion"]["text"])
    for prefix in ("The claim is not stated: ", "No claim: "):
        if text.startswith(prefix):
            text = text[len(prefix):]
    return f"{STATE_WORD[res['state']]}: {e(text)}"


STATE_WORD = {"claim": "Claim", "no-claim": "No claim", "invalid": "Invalid", "not-run": "Not run",
              "unavailable": "Unavailable"}


def _noise_floor_p(art: dict[str, Any]) -> str:
    f = art.get("noise_floor") or {}
    if f.get("evidence") == "measured":
        return (f"<p>Noise floor of the control arm at this recipe: a difference under {f['threshold_nats']:.4f} nats "
                f"is not measurable ({f.get('n_seeds')} seeds, bench/results/{e(f.get('record_file'))}){ev('measured')}."
                "</p>")
    return f"<p>Noise floor: {e(f.get('reason') or 'not measured')}{ev('unavailable')}.</p>"


def _versions(art: dict[str, Any]) -> str:
    rows = [[str(v["version"]), f"<td class='mono'>{e(v.get('artifact_path') or 'none')}</td>", e(v.get("conclusion")),
             f"<td class='mono'>{e(v.get('artifact_sha256') or 'not kept')}</td>",
             f"<td class='mono'>{e(v['sha256'])}</td>"] for v in art.get("versions", [])]
    return table("Earlier protocol versions and their results", ["Version", "Artifact path", "Conclusion",
                                                                 "Artifact SHA-256", "Protocol SHA-256"], rows, "versions")


def _svg_trajectory(art: dict[str, Any]) -> str:
    traj = art.get("trajectory") or {}
    pts = [(p["tick"], p["heldout_nll"]) for a in traj.values() for p in a]
    if not pts:
        return ""
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts) or 1
    y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
    w, h, pad = 640, 220, 40
    sx = (lambda x: pad + (w - 2 * pad) * ((x - x0) / ((x1 - x0) or 1)))
    sy = (lambda y: h - pad + (2 * pad - h) * ((y - y0) / ((y1 - y0) or 1)))
    colors = ["#3182bd", "#e6550d", "#31a354", "#756bb1"]
    out = [f"<figure><svg role='img' aria-label='Median held-out NLL over opportunity ticks per arm' width='{w + 110}' "
           f"height='{h}'><line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#999'/>"
           f"<text x='{pad}' y='{h - 10}'>{x0:,.0f} ticks</text><text x='{w - pad}' y='{h - 10}' text-anchor='end'>"
           f"{x1:,.0f} ticks</text><text x='4' y='{pad}'>{y1:.3f}</text><text x='4' y='{h - pad}'>{y0:.3f}</text>"]
    for i, (arm, ps) in enumerate(traj.items()):
        path = " ".join(f"{sx(p['tick']):.1f},{sy(p['heldout_nll']):.1f}" for p in ps)
        out.append(f"<polyline fill='none' stroke='{colors[i % 4]}' stroke-width='2' points='{path}'/>"
                   f"<text x='{w - pad + 2}' y='{pad + 14 * i}' fill='{colors[i % 4]}'>{e(arm)}</text>")
    out.append("</svg><figcaption>Median trajectory: held-out NLL over opportunity ticks (a logical clock), median "
               "over strata per arm.</figcaption></figure>")
    return "".join(out)


def equal_work_body(res: dict[str, Any]) -> tuple[str, str]:
    art = res["_artifact"]
    st = art["study"]
    t, c = st["treatment"], st["control"]
    rows = []
    for q in art.get("pairs", []):
        v = q.get("values") or {}

        def g(m: str, k: str) -> Any:
            return (v.get(m) or {}).get(k)
        fr, td = g("attempted_flops", "ratio"), g("opportunity_ticks", "difference")
        rows.append([e(q["stratum"]), cell(g("final_heldout_nll", "control"), "measured", ".4f"),
                     cell(g("final_heldout_nll", "treatment"), "measured", ".4f"),
                     cell(g("final_heldout_nll", "difference"), "measured", "+.4f"),
                     cell(None if fr is None else 100 * (1 - fr), "modeled", "+.2f", "%"),
                     cell(None if td is None else -td, "logical", "+,.0f"),
                     cell(g("energy_j", "ratio"), "measured", ".3f")])
    pairs = table(f"Paired evaluation rows ({e(t)} against {e(c)})", [
        "Stratum", f"{e(c)} NLL", f"{e(t)} NLL", f"{e(t)} − {e(c)} NLL", "Attempted FLOPs saved", "Ticks saved",
        "Energy ratio"], rows, "pairs")
    boundary = ("<h3>Modeled mechanics boundary</h3><ul><li>Measured: held-out NLL, useful/attempted tokens, wall "
                "time, bytes.</li><li>Modeled: FLOPs (a measured per-token rate times counted tokens), progress per "
                "FLOP.</li><li>Logical: opportunity ticks (inner-step slots + synchronisations + membership changes "
                "counted from the logs), not seconds.</li><li>Energy: measured only with a readable meter; on this "
                "machine none, so the energy gate is unknown.</li></ul>")
    sentence = study_sentence(res)
    body = (f"<p>Same {fmt(st.get('target_useful_tokens'))} useful tokens for every run; {len(art.get('pairs', []))} "
            f"paired strata.</p>" + _noise_floor_p(art) + gates_table(art) + invalidators_table(art) + pairs
            + _svg_trajectory(art) + evidence_block(res) + study_runs_table(res, f"All {len(art['runs'])} run records")
            + _versions(art) + boundary + study_traces(res))
    return sentence, body


# Marks of the controller timeline: a shape each (no colour needed to tell them apart) and a legend name.
CONTROL_MARKS = {"fault": ("x", "WAN or site fault injected"), "shrink": ("v", "membership shrank"),
                 "rejoin": ("^", "membership grew (rejoin)"), "abstain": ("o", "controller abstained"),
                 "change": ("d", "setting changed")}


def _mark_shape(kind: str, x: float, y: float, title: str) -> str:
    """One mark of the controller timeline: an SVG element of the kind's shape, with its hover title."""
    t = f"<title>{title}</title>"
    if kind == "x":
        return (f"<path d='M{x - 4:.1f},{y - 4:.1f}L{x + 4:.1f},{y + 4:.1f}M{x - 4:.1f},{y + 4:.1f}L{x + 4:.1f},{y - 4:.1f}' "
                f"stroke='#000' stroke-width='1.5'>{t}</path>")
    if kind == "v":
        return f"<path d='M{x - 4:.1f},{y - 3:.1f}L{x + 4:.1f},{y - 3:.1f}L{x:.1f},{y + 4:.1f}Z' fill='#000'>{t}</path>"
    if kind == "^":
        return f"<path d='M{x - 4:.1f},{y + 3:.1f}L{x + 4:.1f},{y + 3:.1f}L{x:.1f},{y - 4:.1f}Z' fill='#000'>{t}</path>"
    if kind == "o":
        return f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3.5' fill='none' stroke='#000'>{t}</circle>"
    return f"<path d='M{x:.1f},{y - 5:.1f}L{x + 5:.1f},{y:.1f}L{x:.1f},{y + 5:.1f}L{x - 5:.1f},{y:.1f}Z' fill='#c00'>{t}</path>"


def _controller_svg(view: dict[str, Any]) -> str:
    """The treatment's and the comparator's settings on one time axis (seconds from each run's first event),
    a row of marks under each: faults, membership changes, abstentions, changes."""
    runs = view.get("runs") or []
    if not runs:
        return f"<p>No controller timeline: {e(view.get('rule'))}.</p>"
    t_max = max((iv["end_s"] for r in runs for iv in r["intervals"]), default=1.0) or 1.0
    t_max = max([t_max] + [m["t_s"] for r in runs for m in r["marks"]])
    left, width, row_h = 120, 960, 62
    height = 30 + row_h * len(runs)
    sx = (lambda t: left + width * max(0.0, min(1.0, t / t_max)))
    palette = ["#9ecae1", "#3182bd", "#a1d99b", "#31a354", "#fdae6b", "#e6550d", "#bcbddc", "#756bb1"]
    labels = list(dict.fromkeys(iv["label"] for r in runs for iv in r["intervals"]))
    color = {lab: palette[i % len(palette)] for i, lab in enumerate(labels)}
    out = [f"<svg role='img' aria-label='Settings of {e(runs[0]['arm'])} and {e(runs[-1]['arm'])} on one time axis, "
           f"stratum {e(view['stratum'])}' width='{left + width + 20}' height='{height}' "
           f"viewBox='0 0 {left + width + 20} {height}'>"]
    for k in range(11):
        x = left + width * k / 10
        out.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='12' y2='{height - 6}' stroke='#eee'/>"
                   f"<text x='{x:.1f}' y='10' text-anchor='middle'>{t_max * k / 10:.0f} s</text>")
    for i, r in enumerate(runs):
        y = 20 + i * row_h
        out.append(f"<text x='4' y='{y + 16}'>{e(r['arm'])}</text>")
        for iv in r["intervals"]:
            x0, x1 = sx(iv["start_s"]), sx(iv["end_s"])
            out.append(f"<rect x='{x0:.1f}' y='{y + 4}' width='{max(0.5, x1 - x0):.1f}' height='20' "
                       f"fill='{color[iv['label']]}' stroke='#fff'><title>{e(iv['label'])}: rounds {iv['first_round']}-"
                       f"{iv['last_round']}, {iv['start_s']:.1f}-{iv['end_s']:.1f} s</title></rect>")
            if x1 - x0 > 70:
                out.append(f"<text x='{x0 + 3:.1f}' y='{y + 18}'>{e(iv['label'])}</text>")
        for m in r["marks"]:
            out.append(_mark_shape(CONTROL_MARKS.get(m["kind"], ("d", ""))[0], sx(m["t_s"]), y + 36,
                                   f"{e(m['kind'])} at {m['t_s']:.1f} s: {e(m.get('text'))}"))
    out.append("</svg>")
    legend = " · ".join(f"<span style='background:{c}'>&nbsp;&nbsp;&nbsp;</span> {e(lab)}" for lab, c in color.items())
    shapes = {"x": "×", "v": "▼", "^": "▲", "o": "○", "d": "◆"}
    marks_legend = " · ".join(f"{shapes[sh]} {e(name)}" for sh, name in CONTROL_MARKS.values())
    return ("<figure>" + "".join(out) + f"<figcaption>Stratum <b>{e(view['stratum'])}</b> ({e(view['rule'])}): the "
            f"setting each round trained in, per arm, on one time axis (seconds from each run's first event); marks "
            f"under each bar: {marks_legend}. Settings: {legend}.</figcaption></figure>")


def _controller_ledgers(view: dict[str, Any], limit: int = 120) -> str:
    """Each run's optimizer-commit ledger: one row per commit, the setting it trained in and the decision after."""
    out = []
    for r in view.get("runs") or []:
        t0 = int(r["t0_wall_ns"])
        rows = []
        for c in r["commit_ledger"][:limit]:
            label = ConsistencySetting.from_json({k: c[k] for k in ("mode", "inner_steps_h", "compression")}).label()
            rows.append([e(c["round"]), fmt((int(c["wall_ns"]) - t0) / 1e9 if c.get("wall_ns") else None, ".1f"),
                         e(c.get("epoch")), e(label), e(c.get("action") or "—"), e(c.get("action_reason") or ""),
                         e(", ".join(c.get("members") or [])), fmt(c.get("useful_tokens")),
                         fmt(c.get("wan_payload_bytes")), fmt(c.get("heldout_nll"), ".4f")])
        cut = f" (the first {limit} of {len(r['commit_ledger'])})" if len(r["commit_ledger"]) > limit else ""
        out.append(f"<details><summary>Optimizer-commit ledger of {e(r['arm'])} ({e(r['run_id'])}): "
                   f"{len(r['commit_ledger'])} commits{cut} {ev('measured')}</summary>"
                   + table(f"Commits of {e(r['arm'])}", ["Round", "t (s)", "Epoch", "Setting", "Decision after",
                                                         "Reason", "Members", "Useful tokens", "WAN payload (B)",
                                                         "Held-out NLL"], rows) + "</details>")
    return "".join(out)


def _saving_goal(fam: dict[str, Any]) -> str:
    """The held-out families that saved the stated share of ticks or bytes (studies/families.py)."""
    g = fam.get("saving_goal")
    if not g:
        return ""
    names = ", ".join(g["families"]) or "none"
    return (f"<p class='saving-goal'>{g['n_saving']} of {g['n_heldout']} held-out families saved at least "
            f"{g['fraction']:.0%} of opportunity ticks or inter-site bytes ({e(names)}); rule: {e(g['rule'])}.</p>")


def controller_body(res: dict[str, Any]) -> tuple[str, str]:
    art = res["_artifact"]
    sentence = study_sentence(res)
    fam = art.get("families") or {}
    ledger = [[e(f["family"]), e(f["split"]), cell(f.get("learning_delta"), "measured", "+.4f"),
               cell(f.get("completion_ratio"), "logical", ".3f"), cell(f.get("wan_ratio"), "measured", ".3f"),
               cell(f.get("work_replayed"), "measured", ","), cell(f.get("energy_ratio"), "measured", ".3f"),
               e(f"{f.get('ranking')}: {f.get('reason')}")] for f in fam.get("ledger", [])]
    regions = [[e(r["family"]), e(", ".join(f"{k}={v}" for k, v in r["region"].items())), e(" < ".join(r["ranking"])),
                e(r.get("hindsight_best") or "none"), e(r.get("reason"))] for r in fam.get("regions", [])]
    view = art.get("controller_view")
    timeline = ("<h3>The controller and the comparator on one time axis</h3>" + _controller_svg(view)
                + _controller_ledgers(view)) if view else ""
    rep = art.get("controller_replay")
    if rep:
        timeline += (f"<p class='replay'>Replay: the {rep['decisions']:,} logged decisions of the {rep['runs']} adaptive "
                     f"runs, replayed through their rule from the logged observations (control/replay.py): "
                     + ("every one reproduced exactly." if not rep["n_mismatches"] else
                        f"{rep['n_mismatches']} not reproduced: {e('; '.join(rep['mismatches'][:3]))}") + "</p>")
    body = (gates_table(art) + invalidators_table(art) + timeline
            + table("Untouched family ledger", ["Family", "Split", "Learning delta (nats)", "Completion ratio",
                                               "WAN ratio", "Work replayed", "Energy ratio", "Ranking / abstention"],
                    ledger)
            + _saving_goal(fam)
            + table("Ranking under uncertainty", ["Family", "Region", "Ranking", "Best in hindsight", "Reason"], regions)
            + evidence_block(res) + study_runs_table(res, "Run records") + _versions(art) + study_traces(res))
    return sentence, body
