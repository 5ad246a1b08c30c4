"""The study page: one self-contained HTML file (no network) from a study artifact, laid out like the
seed's study sections: the headline answer in words, observed medians, the median trajectory over
opportunity ticks, paired intervals (description only), the frozen decision with every gate,
invalidators and no-failure controls, the exact per-stratum table, every run record, earlier
protocol versions with their hashes and conclusions, and provenance with hashes. Each run's
commit/eval/membership trace is written to traces/<run>.js beside the page and loaded on demand.

Every number carries its evidence class (measured / modeled / logical / unavailable) as text,
never as colour alone.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from studies.metrics import steady_logs
from studies.wording import passed_as_written

CSS = """
body{font-family:system-ui,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#1b1b1b;line-height:1.45}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f3f3f3}.ev{font-size:.75em;color:#444;border:1px solid #999;border-radius:3px;padding:0 3px;margin-left:3px}
.pass{background:#e6f4e6}.fail{background:#fbe4e4}.unknown{background:#f1f1f1}.answer{font-size:1.15em;
padding:.6em;border-left:4px solid #333;background:#fafafa}.mono{font-family:ui-monospace,monospace;font-size:.8em;
word-break:break-all}.note{color:#555;font-size:.9em}
"""

JS = """
window.xdcStudyTraces = {};
window.xdcStudyTrace = function (key, data) {
  window.xdcStudyTraces[key] = data;
  var box = document.getElementById('trace-' + key);
  var body = box.querySelector('tbody');
  data.events.forEach(function (e) {
    var tr = document.createElement('tr');
    [e.id, e.event, e.epoch, e.round, e.useful_tokens === undefined ? '' : e.useful_tokens,
     e.heldout_nll === undefined ? '' : e.heldout_nll.toFixed(4), e.wall_ns].forEach(function (v) {
      var td = document.createElement('td'); td.textContent = v === undefined || v === null ? '' : String(v);
      tr.appendChild(td); });
    body.appendChild(tr); });
  box.querySelector('.trace-status').textContent = data.events.length + ' events loaded';
};
function xdcLoadStudyTrace(btn) {
  var s = document.createElement('script'); s.src = btn.dataset.src;
  var status = btn.parentNode.querySelector('.trace-status'); status.textContent = 'loading…';
  s.onerror = function () { status.textContent = 'trace file ' + btn.dataset.src + ' is missing next to the report'; };
  document.body.appendChild(s); btn.disabled = true;
}
"""

UNITS = {"final_heldout_nll": "nats/token", "progress_per_flop": "nats/FLOP", "attempted_flops": "FLOP",
         "opportunity_ticks": "ticks", "wall_s": "s", "inter_site_bytes": "B", "replayed_tokens": "tokens",
         "energy_j": "J", "energy_checkpoint_j": "J", "energy_replay_j": "J"}


def _e(v: Any) -> str:
    return html.escape(str(v))


def fmt(v: Any, metric: str = "") -> str:
    if v is None:
        return "unavailable"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e7 and metric != "final_heldout_nll":
            return f"{int(v):,}"
        if metric in ("progress_per_flop",) or (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e7)):
            return f"{v:.4g}"
        return f"{v:,.4f}" if metric == "final_heldout_nll" else f"{v:,.3f}"
    return str(v)


def mv(metrics: dict[str, Any], name: str) -> Any:
    """A metric's value, None where the run does not have it."""
    return (metrics.get(name) or {}).get("value")


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    h = "".join(f"<th>{_e(x)}</th>" for x in head)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _ev(cls: str) -> str:
    return f"<span class='ev'>{_e(cls)}</span>"


def _svg_trajectory(traj: dict[str, list[dict[str, float]]]) -> str:
    """Median held-out NLL over ticks, one polyline per arm (inline SVG; no library)."""
    pts = [(p["tick"], p["heldout_nll"]) for v in traj.values() for p in v]
    if not pts:
        return "<p>No evaluation points.</p>"
    w, h, m = 640, 260, 48
    x0, x1 = 0.0, max(x for x, _ in pts) or 1.0
    y0, y1 = min(y for _, y in pts), max(y for _, y in pts)
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return m + (x - x0) / (x1 - x0) * (w - 2 * m)

    def sy(y: float) -> float:
        return m + (y1 - y) / (y1 - y0) * (h - 2 * m)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    parts = [f"<svg id='trajectory' role='img' aria-label='median held-out NLL over opportunity ticks' "
             f"width='{w}' height='{h}' viewBox='0 0 {w} {h}'>",
             f"<line x1='{m}' y1='{h - m}' x2='{w - m}' y2='{h - m}' stroke='#333'/>",
             f"<line x1='{m}' y1='{m}' x2='{m}' y2='{h - m}' stroke='#333'/>",
             f"<text x='{w / 2}' y='{h - 10}' text-anchor='middle' font-size='12'>opportunity ticks (logical)</text>",
             f"<text x='12' y='{m - 12}' font-size='12'>held-out NLL (nats/token, measured)</text>",
             f"<text x='{m - 4}' y='{m + 4}' text-anchor='end' font-size='10'>{y1:.2f}</text>",
             f"<text x='{m - 4}' y='{h - m}' text-anchor='end' font-size='10'>{y0:.2f}</text>",
             f"<text x='{w - m}' y='{h - m + 14}' text-anchor='end' font-size='10'>{x1:.0f}</text>"]
    for i, (arm, v) in enumerate(traj.items()):
        c = colors[i % len(colors)]
        line = " ".join(f"{sx(p['tick']):.1f},{sy(p['heldout_nll']):.1f}" for p in v)
        parts.append(f"<polyline class='arm-line' data-arm='{_e(arm)}' fill='none' stroke='{c}' stroke-width='2' "
                     f"points='{line}'/>")
        for p in v:
            parts.append(f"<circle cx='{sx(p['tick']):.1f}' cy='{sy(p['heldout_nll']):.1f}' r='3' fill='{c}'>"
                         f"<title>{_e(arm)}: tick {p['tick']:.0f}, NLL {p['heldout_nll']:.4f}</title></circle>")
        parts.append(f"<text x='{w - m + 4 - 120}' y='{m + 14 * i}' font-size='11' fill='{c}'>— {_e(arm)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def _key(run_key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", run_key)


def _medians_section(art: dict[str, Any]) -> list[str]:
    """The observed medians of every metric, per arm."""
    metrics = art["protocol"]["metrics"]
    out: list[str] = []
    rows = []
    for m in metrics:
        ev = next((r["metrics"][m]["evidence"] for r in art["runs"] if m in r["metrics"]), "unavailable")
        rows.append([f"{_e(m)} ({UNITS.get(m, '')}){_ev(ev)}"] + [fmt(art["medians"][a][m], m) for a in art["medians"]])
    out.append("<section id='medians'><h2>Observed medians</h2>" +
               _table(["Metric", *art["medians"].keys()], rows) + "</section>")
    return out


def _trajectory_section(art: dict[str, Any]) -> list[str]:
    """The median held-out NLL over opportunity ticks."""
    out: list[str] = []
    out.append("<section id='trajectory-section'><h2>Median trajectory</h2><p>Held-out NLL over opportunity ticks "
               "(a logical clock of scheduling opportunities: inner-step slots + synchronisations + membership "
               "changes, from the logs), median over strata at each evaluation.</p>"
               + _svg_trajectory(art["trajectory"]) + "</section>")
    return out


def _intervals_section(art: dict[str, Any]) -> list[str]:
    """The paired bootstrap intervals (description only, never a decision)."""
    t, c = art["study"]["treatment"], art["study"]["control"]
    out: list[str] = []
    rows = []
    for m, iv in art["intervals"].items():
        rows.append([_e(m), fmt(iv.get("low"), m), fmt(iv.get("high"), m), _e(iv.get("method", iv.get("reason", "")))])
    out.append("<section id='intervals'><h2>Paired 90% intervals</h2><p>Paired bootstrap of the mean difference "
               f"{_e(t)} − {_e(c)}: description only, never a decision. Sampling intervals only; infrastructure "
               "uncertainty is the strata's regions, kept separate.</p>"
               + _table(["Metric", "90% low", "90% high", "Method"], rows) + "</section>")
    return out


def _decision_section(art: dict[str, Any]) -> list[str]:
    """The decision rule: the gates as registered, the invalidators and the no-failure controls."""
    st = art["study"]
    out: list[str] = []
    rows = []
    for g in art["gates"]:
        cls = g["status"]
        flags = ("vacuous: " + g["vacuous_reason"]) if g["vacuous"] else ""
        rows.append([_e(g["name"]), _e(g["metric"]), _e(f"{g['kind']} ({g['direction']} is better)"),
                     fmt(g["margin"]), fmt(g["alpha"]), str(g["n"]), fmt(g.get("p")),
                     f"<td class='{cls} gate-status'>{_e(g['status'])}</td>", _e(g["reason"]), _e(flags)])
    out.append(f"<section id='decision'><h2>The decision rule, set in advance</h2><p>{passed_as_written(art['gates'])} "
               "(exact sign-flip permutation test over all 2<sup>n</sup> sign patterns; "
               f"registered protocol sha256 <span class='mono'>{_e(st['sha256'])}</span>).</p>"
               + _table(["Gate", "Metric", "Kind", "Margin", "Alpha", "Pairs", "p", "Status", "Reason", "Flags"],
                        rows, "gates"))
    cmp = st.get("comparator")
    if cmp is not None:  # the control was chosen by the frozen rule, from the rule's split only
        rule = cmp["rule"]
        out.append("<h3 id='comparator'>The fixed comparator, chosen from " + _e(rule["split"]) + " data only</h3>"
                   f"<p>Rule (registered): of {_e(', '.join(rule['choose_from']))}, the arm with the "
                   f"{_e(rule['direction'])} median {_e(rule['metric'])} over the {cmp['strata']} {_e(rule['split'])} "
                   f"strata. <b>{_e(cmp['status'])}</b>: "
                   + (f"{_e(cmp['chosen'])}, by {_e(cmp['reason'])}." if cmp["status"] == "chosen"
                      else f"{_e(cmp['reason'])}; no claim is stated until it is chosen.") + "</p>")
    rows = [[_e(i["name"]), "fired" if i["fired"] else "did not fire", _e("; ".join(map(str, i["evidence"])))]
            for i in art["invalidators"]]
    out.append("<h3>Invalidators</h3>" + _table(["Invalidator", "State", "Evidence"], rows))
    rows = [[_e(x["stratum"]), f"<td class='{_e(x['status'])}'>{_e(x['status'])}</td>", _e(x["reason"])]
            for x in art["controls"]]
    out.append("<h3>No-failure controls</h3>" + (_table(["Stratum", "Status", "State hash, work, final NLL"], rows)
                                                   if rows else "<p>The protocol asks for none.</p>") + "</section>")
    return out


def _pairs_section(art: dict[str, Any]) -> list[str]:
    """The exact paired evaluations, one row per stratum, against the noise floor."""
    t, c = art["study"]["treatment"], art["study"]["control"]
    out: list[str] = []
    head = ["Stratum", "Split", f"{c} NLL", f"{t} NLL", f"{t} − {c} NLL", "vs noise floor", "Attempted-FLOP saved",
            "Ticks saved", "Energy ratio"]
    rows = []
    for q in art["pairs"]:
        v = q["values"]

        def g(m: str, k: str) -> Any:
            return (v.get(m) or {}).get(k)
        saved_f = None if g("attempted_flops", "ratio") is None else 1 - g("attempted_flops", "ratio")
        saved_t = None if g("opportunity_ticks", "difference") is None else 0.0 - g("opportunity_ticks", "difference")
        rows.append([_e(q["stratum"]), _e(q["split"]), fmt(g("final_heldout_nll", "control"), "final_heldout_nll"),
                     fmt(g("final_heldout_nll", "treatment"), "final_heldout_nll"),
                     fmt(g("final_heldout_nll", "difference"), "final_heldout_nll"), _e(q["nll_vs_noise_floor"]),
                     "unavailable" if saved_f is None else f"{100 * saved_f:.1f}% {_ev('modeled')}",
                     "unavailable" if saved_t is None else f"{fmt(saved_t + 0.0)} {_ev('logical')}",
                     fmt(g("energy_j", "ratio"))])
    floor = art["noise_floor"]
    ftxt = (f"noise floor {floor['threshold_nats']:.4f} nats ({floor['n_seeds']} seeds"
            f"{', bench/results/' + floor['record_file'] if floor.get('record_file') else ''})"
            if floor.get("evidence") == "measured" else f"noise floor unavailable: {floor.get('reason', '')}")
    out.append(f"<section id='pairs'><h2>Exact paired evaluations</h2><p>{_e(ftxt)}.</p>"
               + _table(head, rows, "pairs") + "</section>")
    return out


def _runs_section(art: dict[str, Any]) -> list[str]:
    """One row per run record, with its hashes and a lazily loaded trace."""
    out: list[str] = []
    rows = []
    for r in art["runs"]:
        rec, m = r["record"], r["metrics"]
        k = _key(r["key"])
        rows.append([_e(r["key"]), _e(r["split"]), _e(r["arm"]), _e(f"{rec.get('mode')}/{rec.get('policy')}"),
                     "yes" if rec.get("interrupted") else "no", fmt(rec.get("final_heldout_nll"), "final_heldout_nll"),
                     f"{fmt(rec.get('attempted_tokens'))} / {fmt(rec.get('useful_tokens'))}",
                     fmt(mv(m, "opportunity_ticks")), fmt(mv(m, "wall_s")),
                     f"{fmt(mv(m, 'energy_j'))} {_ev((m.get('energy_j') or {}).get('evidence', 'unavailable'))}",
                     fmt(rec.get("checkpoints")),
                     f"<td class='mono'>{_e(r['hashes']['logs_sha256'][:16])}…</td>",
                     f"<td><div class='trace' id='trace-{k}'><button type='button' data-src='traces/{k}.js' "
                     "onclick='xdcLoadStudyTrace(this)'>Load trace</button> <span class='trace-status'>not loaded"
                     "</span><table><tbody></tbody></table></div></td>"])
    out.append("<section id='runs'><h2>Run records</h2>" + _table(
        ["Run", "Split", "Arm", "Mode / policy", "Interrupted", "Final NLL", "Attempted / canonical tokens",
         "Opportunity ticks", "Wall s", "Device energy", "Checkpoints", "Logs SHA-256", "Trace"], rows, "runs")
        + "</section>")
    return out


def _families_section(art: dict[str, Any]) -> list[str]:
    """The untouched family ledger and the rankings under uncertainty (if the study has families)."""
    out: list[str] = []
    fam = art.get("families") or {}
    if fam.get("ledger"):
        rows = [[_e(f["family"]), _e(f["split"]), fmt(f["learning_delta"], "final_heldout_nll"),
                 fmt(f["completion_ratio"]), fmt(f["wan_ratio"]), fmt(f["work_replayed"]), fmt(f["energy_ratio"]),
                 _e(f"{f['ranking']}: {f['reason']}")] for f in fam["ledger"]]
        out.append("<section id='families'><h2>Untouched family ledger</h2><p>No family disappears inside a median: "
                   "one row per stress family (treatment − control).</p>" + _table(
                       ["Family", "Split", "Learning delta (nats)", "Completion ratio (ticks)", "WAN ratio",
                        "Work replayed (tokens)", "Energy ratio", "Ranking / abstention"], rows, "families"))
        rows = [[_e(r["family"]), _e(", ".join(f"{k}={v}" for k, v in r["region"].items())),
                 _e(" < ".join(r["ranking"])), _e(r["hindsight_best"] or "none"),
                 "flips between regions" if r.get("ranking_flips_in_family") else "stable", _e(r["reason"])]
                for r in fam["regions"]]
        out.append("<h3>Ranking under uncertainty</h3><p>Each region is a labelled condition of infrastructure "
                   "uncertainty, kept apart from the sampling intervals above.</p>" + _table(
                       ["Family", "Uncertainty region", "Ranking (lowest NLL first)", "Best in hindsight",
                        "Ranking", "Reason"], rows, "regions") + "</section>")
    return out


def _versions_section(art: dict[str, Any]) -> list[str]:
    """Earlier registered versions of the protocol and their conclusions."""
    out: list[str] = []
    rows = [[str(v["version"]), _e(v.get("artifact_path") or "none"), _e(v["conclusion"]),
             f"<td class='mono'>{_e(v['sha256'])}</td>"] for v in art["versions"]]
    out.append("<section id='versions'><h2>Earlier protocol results</h2>"
               + (_table(["Version", "Artifact path", "Conclusion", "SHA-256"], rows) if rows else
                  "<p>None: this is the first registered version.</p>") + "</section>")
    return out


def _provenance_section(art: dict[str, Any]) -> list[str]:
    """Code revisions, the canonical protocol as hashed, and every run's hashes."""
    st = art["study"]
    out: list[str] = []
    prov = art["provenance"]
    revs = ", ".join(f"{(r or {}).get('commit')}{' (dirty)' if (r or {}).get('dirty') else ''}"
                     for r in prov["code_revisions"])
    out.append(f"<section id='provenance'><h2>Source hashes and complete provenance</h2><p>Code revision(s) of the "
               f"runs: <span class='mono'>{_e(revs)}</span>{' — MIXED' if prov['mixed_code_revisions'] else ''}. "
               f"Registered at {_e(st.get('registered_utc'))} from {_e(st.get('protocol_file'))}.</p>"
               + "".join(f"<p class='note'>{_e(n)}</p>" for n in prov.get("notes", []))
               + "<details><summary>Canonical protocol (what was hashed)</summary><pre class='mono'>"
               + _e(json.dumps(art["protocol"], indent=1, sort_keys=True)) + "</pre></details>"
               + "<details><summary>Run hashes</summary>" + _table(
                   ["Run", "Directory", "config.json", "summary.json", "logs"],
                   [[_e(r["key"]), f"<td class='mono'>{_e(r['run_dir'])}</td>"] +
                    [f"<td class='mono'>{_e(r['hashes'][h])}</td>" for h in
                     ("config_sha256", "summary_sha256", "logs_sha256")] for r in art["runs"]]) + "</details></section>")
    return out


def render(art: dict[str, Any]) -> str:
    st, concl = art["study"], art["conclusion"]
    t, c = st["treatment"], st["control"]
    out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Study {_e(st['name'])}</title>"
           f"<style>{CSS}</style><script>{JS}</script></head><body>"]
    out.append(f"<section id='headline'><p class='note'>Measured on this machine · study {_e(st['name'])} · "
               f"protocol version {st['version']} · {st['n_runs_finished']} of {st['n_runs_planned']} runs</p>"
               f"<h1>{_e(st['question'])}</h1><p class='answer' id='answer' data-status='{_e(concl['status'])}'>"
               f"{_e(concl['text'])}</p><p>Same {st['target_useful_tokens']:,} useful tokens per run; paired by "
               f"stratum (seed, data order, fault schedule and link profile shared by every arm); difference = "
               f"<b>{_e(t)}</b> − <b>{_e(c)}</b>; gates decided on the {_e(st['evaluation_split'])} strata.</p>"
               f"<p>Learning check: {_e(art['learning']['text'])}</p></section>")
    from studies.energy_report import energy_sections

    for section in (_medians_section, _trajectory_section, _intervals_section, _decision_section, _pairs_section,
                    _runs_section, _families_section):
        out += section(art)
    out.append(energy_sections(art))  # the energy study's sections (only when the artifact has them)
    for section in (_versions_section, _provenance_section):
        out += section(art)
    out.append("</body></html>")
    return "".join(out)


TRACE_EVENTS = ("commit", "eval", "membership_epoch", "recovery_decision", "round_abandoned", "site_failed")


def write_traces(art: dict[str, Any], out_dir: Path) -> None:
    (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    keep = ("id", "event", "epoch", "round", "useful_tokens", "heldout_nll", "wall_ns", "members", "reason")
    for r in art["runs"]:
        # On the run's steady axis (analysis/clock.py), as the run's summary and the tick axis are:
        # sorted by the raw wall clock, a step mid-run moved (or, stepping back, reordered) every
        # later event of the trace.
        logs = steady_logs(Path(r["run_dir"]))  # {} when the run left no logs
        events = [{k: e[k] for k in keep if k in e}
                  for name in sorted(logs) for e in logs[name] if e.get("event") in TRACE_EVENTS]
        events.sort(key=lambda e: int(e.get("wall_ns", 0)))
        k = _key(r["key"])
        (out_dir / "traces" / f"{k}.js").write_text(
            f"window.xdcStudyTrace({json.dumps(k)}, {json.dumps({'events': events})});\n")


def write_report(art: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_traces(art, out_dir)
    from studies.energy_report import write_energy_trace

    write_energy_trace(art, out_dir)
    path = out_dir / "index.html"
    path.write_text(render(art))
    return path
