"""The static report page: one self-contained `report/index.html` built from the artifact.

The page opens from disk with no network: Plotly's JavaScript is inlined once, every chart is
drawn from numbers in the artifact, and every number carries its evidence class. Raw event
traces are not inlined; each run's trace is written to `report/traces/<run>.js` and loaded on
demand by a button (a <script> tag, which works from file:// where fetch() does not).

Sections (ids are stable; the browser test finds them):
  recovery    The same failure, four ways to recover: timelines on one axis + accessible list
  work        Where the work went: attempted = retained + lost, fate of each lost unit
  bytes       Where the inter-site bytes went: six classes, reconciliation with Toxiproxy
  completion  Mechanical completion: the same durable frontier, matched-frontier hashes, lineage
  learning    Did the model still learn as well? Verdict against the count baselines, NLL over time with
              the baselines drawn, eval set id, final NLL ± SE, baselines table, run-level table
  energy      Energy: meter validity before effect, then run and phase energy (analysis/energy_report.py)
  checks      The checkers' verdicts with evidence
  provenance  Code revision, dataset, runtime, scenario, input hashes, raw traces on demand
"""

from __future__ import annotations

import json
import re
from html import escape
from pathlib import Path
from typing import Any

from analysis import figures
from analysis.controller_report import controller_section_html
from analysis.energy_report import energy_section_html, write_energy_traces
from analysis.learning import verdict
from analysis.load import RunHistory

SECTIONS = ("recovery", "work", "bytes", "completion", "learning", "controller", "energy", "checks", "provenance")
CHART_SECTIONS = ("recovery", "work", "bytes", "completion", "learning")
MAX_TRACE_EVENTS = 200_000  # per run; beyond this the trace file says it is truncated

CSS = """
body{font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#fafafa}
header,section{max-width:1180px;margin:0 auto;padding:18px 28px}
header{padding-top:28px} h1{font-size:1.7em;margin:.2em 0} h2{font-size:1.3em;border-bottom:1px solid #ddd;padding-bottom:4px}
.lede{font-size:1.08em;max-width:900px} nav a{margin-right:14px}
table{border-collapse:collapse;margin:10px 0;font-size:.92em} th,td{border-bottom:1px solid #e3e3e3;padding:4px 9px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.ev{font-size:.72em;padding:0 5px;border-radius:8px;margin-left:4px;white-space:nowrap}
.ev-measured{background:#e6f2e6;color:#245c24}.ev-modeled{background:#e7eefa;color:#22427a}
.ev-prior{background:#f3ecdf;color:#6a4b12}.ev-unavailable{background:#eee;color:#666}
.pass{color:#1b7a1b;font-weight:600}.fail{color:#b3261e;font-weight:600}.unknown{color:#8a6d00;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:10px 14px;min-width:180px}
.card .big{font-size:1.4em;font-weight:600} code,.hash{font-family:ui-monospace,monospace;font-size:.88em;word-break:break-all}
.chart{background:#fff;border:1px solid #e3e3e3;border-radius:6px;margin:8px 0}
details{margin:8px 0} summary{cursor:pointer;font-weight:600}
.trace td{max-width:560px;word-break:break-all;font-size:.8em;font-family:ui-monospace,monospace}
"""

TRACE_JS = """
window.xdcTraces = {};
window.xdcTraceLoaded = function (runKey, meta, events) {
  window.xdcTraces[runKey] = events;
  var box = document.getElementById('trace-' + runKey);
  var status = box.querySelector('.trace-status');
  status.textContent = events.length.toLocaleString() + ' events loaded' + (meta.truncated ? ' (first ' + events.length.toLocaleString() + ' of ' + meta.total.toLocaleString() + ')' : '');
  var input = box.querySelector('input'); input.hidden = false;
  var base = {id: 1, event: 1, process: 1, wall_ns: 1, epoch: 1, run_id: 1, mono_ns: 1, pid: 1, step: 1};
  events.sort(function (a, b) { return a.wall_ns - b.wall_ns; });
  var render = function () {
    var q = input.value.trim(); var rows = [];
    for (var i = 0; i < events.length && rows.length < 300; i++) {
      var e = events[i]; if (q && e.event.indexOf(q) < 0 && e.id.indexOf(q) < 0) continue; rows.push(e);
    }
    var tb = box.querySelector('tbody'); tb.innerHTML = '';
    rows.forEach(function (e) {
      var tr = document.createElement('tr');
      var rest = {}; Object.keys(e).forEach(function (k) { if (!base[k]) rest[k] = e[k]; });
      [e.id, e.event, e.process, String(e.wall_ns), String(e.epoch), JSON.stringify(rest)].forEach(function (v) {
        var td = document.createElement('td'); td.textContent = v; tr.appendChild(td); });
      tb.appendChild(tr);
    });
    box.querySelector('table').hidden = false;
  };
  input.oninput = render; render();
};
function xdcLoadTrace(btn) {
  var s = document.createElement('script'); s.src = btn.dataset.src;
  var status = btn.parentNode.querySelector('.trace-status'); status.textContent = 'loading…';
  s.onerror = function () { status.textContent = 'trace file ' + btn.dataset.src + ' is missing next to the report'; };
  document.body.appendChild(s); btn.disabled = true;
}
"""


def ev(evidence: str) -> str:
    return f'<span class="ev ev-{escape(evidence)}">{escape(evidence)}</span>'


def num(value: Any, evidence: str = "measured", unit: str = "", fmt: str = ",") -> str:
    """A table cell holding a number and its evidence class."""
    if value is None:
        return f'<td class="num">—{ev("unavailable" if evidence == "measured" else evidence)}</td>'
    text = format(value, fmt) if isinstance(value, (int, float)) else escape(str(value))
    return f'<td class="num">{text}{(" " + escape(unit)) if unit else ""}{ev(evidence)}</td>'


def qcell(qty: dict[str, Any], fmt: str = ",") -> str:
    return num(qty.get("value"), qty.get("evidence", "measured"), qty.get("unit", ""), fmt)


def _key(run: dict[str, Any]) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", run["run_id"])


def _fig_html(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


# ----------------------------------------------------------------------------------------- sections
def _lede(art: dict[str, Any]) -> str:
    runs = art["runs"]
    scen = art.get("scenario") or {}
    faults = runs[0].get("faults", [])
    what = (", ".join(f"{f['kind']} of {f['target']} at t≈{f['t_s']:.1f} s" for f in faults[:3])
            if faults else "no fault fired")
    missed = _not_fired(art)
    if missed:
        what += ("; scheduled but did not fire: "
                 + "; ".join(f"{pol}: {f['description']} ({f['reason']})" for pol, f in missed[:4]))
    same = art["comparison"]["matched_frontier"]
    fr = runs[0]["frontier"]
    lost = " · ".join(f"{r['policy']} {r['metrics']['lost_tokens']['value']:,}" for r in runs)
    idle = " · ".join(f"{r['policy']} {r['metrics']['idle_time_all_sites']['value']:.1f} s" for r in runs)
    verdicts = [c for c in art["checks"] if c["status"] != "pass"]
    tail = ("Every checker passed." if not verdicts else
            "Checkers not passing: " + ", ".join(f"{c['name']} ({c['status']})" for c in verdicts) + ".")
    return (f"<p class='lede'>Scenario <b>{escape(str(scen.get('name', 'none')))}</b>: {escape(what)} "
            f"(first run's clock). {len(runs)} run(s), policies {escape(', '.join(r['policy'] for r in runs))}. "
            + (f"All reached the same durable frontier: {fr['useful_tokens']:,} useful tokens, "
               f"matched-frontier hash <span class='hash'>{escape(str(fr['hash'])[:16])}…</span>. " if same and len(runs) > 1
               else f"Durable frontier: {fr['useful_tokens']:,} useful tokens. ")
            + f"Lost tokens: {escape(lost)} {ev('measured')}. Idle site-seconds: {escape(idle)} {ev('measured')}. "
            + escape(tail) + "</p>")


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _not_fired(art: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(policy, fault) for every scheduled fault that did not fire, over all runs."""
    return [(r["policy"], f) for r in art["runs"] for f in (r.get("fault_schedule") or {}).get("not_fired", [])]


def recovery_title(art: dict[str, Any]) -> tuple[str, str]:
    """The timeline section's title and a warning: it speaks of "the same failure" only when a fault
    fired in every run and no scheduled fault failed to fire."""
    runs = art["runs"]
    fired = [len((r.get("fault_schedule") or {}).get("fired", [])) for r in runs]
    missed = _not_fired(art)
    warn = ""
    if missed:
        warn = ("<p class='fail' id='faults-not-fired'>Scheduled faults that did not fire: "
                + "; ".join(f"{escape(pol)}: {escape(f['description'])} ({escape(f['reason'])})" for pol, f in missed)
                + ".</p>")
    if all(fired) and not missed:
        n = len(runs)
        word = NUMBER_WORDS[n] if n < len(NUMBER_WORDS) else str(n)
        return (f"The same failure, {word} ways to recover" if n > 1 else "The failure and its recovery"), warn
    if not any(fired):
        if not warn:
            warn = "<p class='unknown' id='faults-not-fired'>No fault was scheduled: these runs had no failure.</p>"
        return "Recovery timeline: no fault fired", warn
    return "Recovery timeline: a scheduled fault did not fire in every run", warn


def _recovery_section(art: dict[str, Any]) -> str:
    runs = art["runs"]
    title, warn = recovery_title(art)
    rows = []
    for r in runs:
        t0 = r["t0_wall_ns"]
        for m in r["timeline"]["marks"]:
            rows.append(f"<tr><td>{escape(r['policy'])}</td><td>{escape(m['kind'])}</td>"
                        f"<td>{escape(m['site'] or 'cluster')}</td>{num(round((m['start_ns'] - t0) / 1e9, 3), unit='s')}"
                        f"<td><code>{escape(m['event_id'])}</code></td>{num(m['start_ns'], fmt='d')}"
                        f"{num(m['end_ns'], fmt='d')}<td>{escape(m['label'])}</td></tr>")
    return (
        f"<section id='recovery' data-section='recovery'><h2>{escape(title)}</h2>{warn}"
        "<p>One track per policy on one shared time axis (seconds since each run's start). Bars are the phases "
        "each site logged — compute, collective, state transfer, checkpoint, recovery, eval, waiting; marks are "
        "failure, preemption, restore, replay and rejoin events. Hover a mark for its event id and nanosecond "
        f"bounds. {ev('measured')}</p>"
        f"<div class='chart' data-chart='recovery'>{_fig_html(figures.timeline_figure(runs), 'chart-recovery')}</div>"
        "<details><summary>Accessible recovery timeline list</summary>"
        "<table id='timeline-list'><thead><tr><th>Policy</th><th>Mark</th><th>Site</th><th>t</th><th>Event id</th>"
        "<th>start_ns</th><th>end_ns</th><th>What happened</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></details></section>")


def _work_section(art: dict[str, Any]) -> str:
    runs = art["runs"]
    head = ("<tr><th>Policy</th><th>Attempted tokens</th><th>Retained</th><th>Lost</th><th>Replayed</th>"
            "<th>Attempted FLOPs</th><th>Lost FLOPs</th><th>Balanced</th></tr>")
    rows = []
    for r in runs:
        m = r["metrics"]
        rows.append(f"<tr><td>{escape(r['policy'])}</td>{qcell(m['attempted_tokens'])}{qcell(m['retained_tokens'])}"
                    f"{qcell(m['lost_tokens'])}{qcell(m['replayed_tokens'])}{qcell(m['attempted_flops'], '.3e')}"
                    f"{qcell(m['lost_flops'], '.3e')}<td class='{'pass' if r['work']['balanced'] else 'fail'}'>"
                    f"{'yes' if r['work']['balanced'] else 'NO'}</td></tr>")
    site_rows = []
    for r in runs:
        for s, w in r["work"]["per_site"].items():
            site_rows.append(f"<tr><td>{escape(r['policy'])}</td><td>{escape(s)}</td>{num(w['attempted_tokens'])}"
                             f"{num(w['retained_tokens'])}{num(w['lost_tokens'])}</tr>")
    fate_rows = []
    for r in runs:
        for u in r["work"]["lost_units"][:200]:
            fate_rows.append(f"<tr><td>{escape(r['policy'])}</td><td>{escape(u['site'])}</td><td>{u['epoch']}</td>"
                             f"<td>{u['round']}</td>{num(u['tokens'])}<td>{escape(u['fate'].replace('_', ' '))}</td></tr>")
        if not r["work"]["lost_units"]:
            fate_rows.append(f"<tr><td>{escape(r['policy'])}</td><td colspan='5'>nothing lost: every attempted "
                             "unit is in the final lineage</td></tr>")
    return (
        "<section id='work' data-section='work'><h2>Where the work went</h2>"
        "<p>Work is counted in canonical samples and FLOPs. Retained work is in the durable lineage of the final "
        "model; lost work was computed and then discarded; replayed work is lost work attempted again. "
        f"attempted = retained + lost, exactly. {ev('measured')} FLOPs are derived, not read from a counter: "
        f"the FLOP/token measured once by torch's FlopCounterMode times the tokens counted {ev('modeled')}.</p>"
        f"<div class='chart' data-chart='work'>{_fig_html(figures.work_figure(runs), 'chart-work')}</div>"
        f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"
        "<details><summary>Per site</summary><table><thead><tr><th>Policy</th><th>Site</th><th>Attempted</th>"
        f"<th>Retained</th><th>Lost</th></tr></thead><tbody>{''.join(site_rows)}</tbody></table></details>"
        "<details><summary>What happened to each lost unit of work</summary><table><thead><tr><th>Policy</th>"
        "<th>Site</th><th>Epoch</th><th>Round</th><th>Tokens</th><th>Fate</th></tr></thead><tbody>"
        f"{''.join(fate_rows)}</tbody></table></details></section>")


def _bytes_section(art: dict[str, Any]) -> str:
    runs = art["runs"]
    classes = list(figures.CLASS_COLORS)
    rows = []
    for r in runs:
        by = r["bytes"]["by_class"]
        rec = r["reconciliation"]
        if rec.get("evidence") == "measured":
            recon = (f"{num(rec['proxy_total'])}{num(rec['overhead_bytes'])}"
                     f"{num(round(100 * rec['overhead_fraction'], 3), unit='%')}")
        else:
            recon = f"<td colspan='3'>{ev('unavailable')} {escape(str(rec.get('reason', '')))}</td>"
        rows.append(f"<tr><td>{escape(r['policy'])}</td>" + "".join(num(by.get(c, 0)) for c in classes)
                    + num(sum(by.values())) + recon + "</tr>")
    return (
        "<section id='bytes' data-section='bytes'><h2>Where the inter-site bytes went</h2>"
        "<p>Every byte between sites (and between a site and a service) is counted by its sender in exactly one "
        "of six classes. The sum reconciles with Toxiproxy's own per-proxy counters; the difference is ZMTP/CURVE "
        f"framing that no class owns. {ev('measured')}</p>"
        f"<div class='chart' data-chart='bytes'>{_fig_html(figures.bytes_figure(runs), 'chart-bytes')}</div>"
        "<table><thead><tr><th>Policy</th>" + "".join(f"<th>{c}</th>" for c in classes)
        + "<th>Sum of classes</th><th>Toxiproxy</th><th>Framing overhead</th><th>Overhead</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table>"
        + ("<p>A negative overhead means the senders counted more than reached Toxiproxy: messages handed to "
           "ZeroMQ for a peer that had gone were dropped unsent, then resent and counted again (the "
           "<code>byte_classes</code> check bounds this by the resent bytes of each link).</p>"
           if any(r["reconciliation"].get("overhead_bytes", 0) < 0 for r in runs) else "")
        + "</section>")


_PROOF_CLASS = {"proven": "pass", "mismatch": "fail", "unknown": "unknown"}


def _proof_text(pr: dict[str, Any]) -> str:
    if pr.get("status") == "proven":
        return "proven: the retained samples are the logged hash and the canonical prefix"
    if pr.get("status") == "mismatch":
        return "MISMATCH: " + "; ".join(pr.get("problems", [])[:2])
    return "unknown: " + "; ".join(pr.get("missing", [])[:2])


def _completion_section(art: dict[str, Any]) -> str:
    runs = art["runs"]
    rows = []
    for r in runs:
        f = r["frontier"]
        pr = f.get("proof") or {}
        rows.append(f"<tr><td>{escape(r['policy'])}</td>{num(f['round'])}{num(f['useful_tokens'])}"
                    f"<td class='hash'>{escape(str(f['hash']))}</td>"
                    f"<td class='hash'>{escape(str(pr.get('retained_sha256')))}</td>"
                    f"<td class='{_PROOF_CLASS.get(pr.get('status'), 'unknown')}'>{escape(_proof_text(pr))}</td>"
                    f"<td class='hash'>{escape(str(f['manifest_hash']))}</td>"
                    f"<td><code>{escape(str(f.get('event_id')))}</code></td></tr>")
    tree_rows = []
    for r in runs:
        for n in r["checkpoint_tree"]:
            tree_rows.append(f"<tr><td>{escape(r['policy'])}</td><td>{escape(str(n.get('ckpt_id')))}</td>"
                             f"{num(n.get('round'))}<td class='hash'>{escape(n['manifest_hash'][:16])}</td>"
                             f"<td class='hash'>{escape(str(n['parent'])[:16])}</td>"
                             f"<td>{'final lineage' if n['in_final_lineage'] else 'abandoned branch'}</td></tr>")
    matched = art["comparison"]["matched_frontier"]
    verdict = (f"<p class='{'pass' if matched else 'fail'}'>"
               + ("Matched: every run ends at the same durable frontier (same useful samples)." if matched and len(runs) > 1
                  else ("One run: its durable frontier is below." if len(runs) == 1 else
                        "NOT matched: the runs end at different frontiers.")) + "</p>")
    return (
        "<section id='completion' data-section='completion'><h2>Mechanical completion</h2>"
        "<p>The durable frontier is the last checkpoint the store acknowledged as safely written. Its hash covers "
        "the samples it contains, so equal hashes mean the same useful work. The analysis does not take the "
        "writer's word for it: it recomputes the samples from the coordinator's commit lineage and the sites' own "
        "work logs, and checks them against the logged hash and the canonical prefix. "
        f"{ev('measured')}</p>"
        f"{verdict}<div class='chart' data-chart='completion'>"
        f"{_fig_html(figures.frontier_figure(runs), 'chart-completion')}</div>"
        "<table><thead><tr><th>Policy</th><th>Frontier round</th><th>Useful tokens</th><th>Matched-frontier hash</th>"
        "<th>Recomputed from the lineage</th><th>Proof</th>"
        f"<th>Manifest hash</th><th>Event</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "<details><summary>Checkpoint lineage (abandoned branches kept)</summary><table><thead><tr><th>Policy</th>"
        "<th>Checkpoint</th><th>Round</th><th>Manifest</th><th>Parent</th><th>Branch</th></tr></thead><tbody>"
        f"{''.join(tree_rows)}</tbody></table></details></section>")


def _se_text(se: Any) -> str:
    return f" ± {se:.4f}" if isinstance(se, (int, float)) else ""


def learning_verdict(art: dict[str, Any]) -> dict[str, str]:
    """The report's sentence on whether the runs learned, from the artifact (rules: analysis/learning.py)."""
    unavailable = {"evidence": "unavailable", "reason": "not in the artifact (built before baselines existed)"}
    return verdict([{"policy": r["policy"], "final_nll": r["metrics"]["final_heldout_nll"]["value"],
                     "baselines": r["learning"].get("baselines") or unavailable} for r in art["runs"]])


def _eval_set_words(runs: list[dict[str, Any]]) -> str:
    es = [r["learning"].get("eval_set") or {} for r in runs]
    ids = {e.get("id") for e in es if e.get("evidence") == "measured"}
    if not ids:
        return f"<p>The evaluation set is not named in these logs (older runs). {ev('unavailable')}</p>"
    e = next(x for x in es if x.get("evidence") == "measured")
    same = "every run" if len(ids) == 1 and all(x.get("evidence") == "measured" for x in es) else "NOT every run"
    return (f"<p>Held-out NLL is the mean over a fixed evaluation set of {e['tokens']['value']:,} tokens (windows spread "
            f"evenly over the whole held-out split), <span class='hash'>{escape(str(e['id'])[:16])}</span>, the same "
            f"for {same}. ± is the standard error of that mean over the windows. {ev('measured')}</p>")


def _baselines_table(runs: list[dict[str, Any]]) -> str:
    b = next((r["learning"].get("baselines") for r in runs
              if (r["learning"].get("baselines") or {}).get("evidence") == "measured"), None)
    if b is None:
        reason = next(((r["learning"].get("baselines") or {}).get("reason") for r in runs), None) or "not logged"
        return f"<p data-baselines='unavailable'>Baselines unavailable: {escape(str(reason))}. {ev('unavailable')}</p>"
    rows = "".join(f"<tr><td>{escape(name)}</td>{num(m['value'], 'measured', '', '.4f')}"
                   f"<td class='num'>{_se_text(m.get('se'))}</td><td>{escape(str(m.get('model')))}</td></tr>"
                   for name, m in b["models"].items())
    return ("<h3>Baselines on the same evaluation set</h3><p>Count models fitted on the training split and "
            "scored on the same windows and targets as the model (same context: bytes of the window).</p>"
            "<table data-baselines='measured'><thead><tr><th>Baseline</th><th>NLL (nats/token)</th><th>SE</th>"
            f"<th>Model</th></tr></thead><tbody>{rows}</tbody></table>")


def _learning_section(art: dict[str, Any]) -> str:
    runs = art["runs"]
    cards = []
    for r in runs:
        m = r["metrics"]
        nll = m["final_heldout_nll"]
        cards.append(f"<div class='card'><div>{escape(r['policy'])}</div><div class='big'>"
                     f"{'—' if nll['value'] is None else format(nll['value'], '.4f')}{_se_text(nll.get('se'))}</div>"
                     f"<div>final held-out NLL "
                     f"(nats/token){ev(nll['evidence'])}</div><div>{m['attempted_tokens']['value']:,} tokens attempted"
                     f"{ev(m['attempted_tokens']['evidence'])}</div></div>")
    rows = []
    for r in runs:
        m = r["metrics"]
        energy = m["energy"]
        rows.append(f"<tr><td>{escape(r['run_id'])}</td><td>{escape(r['policy'])}</td>{qcell(m['final_heldout_nll'], '.4f')}"
                    f"<td class='num'>{_se_text(m['final_heldout_nll'].get('se'))}</td>"
                    f"{qcell(m['attempted_tokens'])}"
                    f"<td class='num' title='{escape(str(energy.get('reason', '')))}'>—{ev(energy['evidence'])}</td>"
                    f"{qcell(m['active_time'], '.1f')}{qcell(r['duration'], '.1f')}</tr>")
    v = learning_verdict(art)
    learning_fig = figures.learning_figure(runs, reference=_refs(art).get("reference"))
    return (
        "<section id='learning' data-section='learning'><h2>Did the model still learn as well?</h2>"
        "<p>Lower held-out loss means the model predicts unseen text better. The lines show what each policy "
        f"learned over the same failure clock; the cards show how much training each attempted. {ev('measured')}</p>"
        f"<p class='verdict' data-learning-verdict='{escape(v['status'])}'><b>{escape(v['text'])}</b></p>"
        f"{_eval_set_words(runs)}"
        f"<div class='cards'>{''.join(cards)}</div>"
        f"<div class='chart' data-chart='learning'>{_fig_html(learning_fig, 'chart-learning')}</div>"
        f"{_baselines_table(runs)}"
        + _learning_refs_block(art) +
        "<h3>Run-level measurements</h3><table><thead><tr><th>Run</th><th>Policy</th><th>Final NLL</th><th>SE</th>"
        "<th>Attempted tokens</th><th>Energy</th><th>Active time</th><th>Wall time</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></section>")


def _refs(art: dict[str, Any]) -> dict[str, Any]:
    return art.get("learning_refs") or {}


def _learning_refs_block(art: dict[str, Any]) -> str:
    """The single-process reference's gap per policy, the noise floor, and every policy pair's
    difference judged against it (analysis/learning_refs.py)."""
    refs = _refs(art)
    parts = []
    ref = refs.get("reference")
    if ref and ref.get("evidence") == "measured":
        gaps = ", ".join(f"{escape(p)} {g:+.4f}" for p, g in ref["gap_by_policy"].items() if g is not None)
        parts.append(f"<p data-ref='reference'>One process trained on the same samples with the same schedule and no "
                     f"WAN (dashed line, its own clock) ended at <b>{ref['final_heldout_nll']:.4f}</b> nats/token"
                     f"{ev('measured')}; each policy's final NLL minus it: {gaps}.</p>")
    elif ref:
        parts.append(f"<p data-ref='reference'>Single-process reference: {escape(ref.get('reason', ''))}"
                     f"{ev('unavailable')}</p>")
    floor = refs.get("noise_floor") or {}
    if floor.get("evidence") == "measured":
        parts.append(f"<p data-ref='noise-floor'>Noise floor: over {floor['n_seeds']} model-init seeds of this config "
                     f"(no faults) the final NLL has std {floor['std_nll']:.4f} and spread {floor['spread_nll']:.4f} "
                     f"nats{ev('measured')}; a difference under {floor['threshold_nats']:.4f} nats is "
                     "\u201cno measurable difference\u201d.</p>")
    elif floor:
        parts.append(f"<p data-ref='noise-floor'>Noise floor: {escape(floor.get('reason', ''))}{ev('unavailable')}</p>")
    rows = "".join(f"<tr><td>{escape(d['b'])} \u2212 {escape(d['a'])}</td><td class='num'>{d['difference_nats']:+.4f}</td>"
                   f"<td>{escape(d['verdict'])}</td></tr>" for d in refs.get("differences", []))
    if rows:
        parts.append("<table data-ref='differences'><thead><tr><th>Final NLL difference</th><th>nats/token</th>"
                     f"<th>Against the noise floor</th></tr></thead><tbody>{rows}</tbody></table>")
    return "".join(parts)


def _checks_section(art: dict[str, Any]) -> str:
    rows = []
    for c in art["checks"]:
        evid = "".join(f"<li>{escape(x)}</li>" for x in c["evidence"])
        more = f" ({c['n_violations']} in all)" if c.get("n_violations", 0) > len(c["evidence"]) else ""
        rows.append(f"<tr data-check='{escape(c['name'])}'><td>{escape(c['name'])}</td><td class='{escape(c['status'])}'>"
                    f"{escape(c['status'])}</td><td>{escape(c['summary'])}{escape(more)}<ul>{evid}</ul></td></tr>")
    return ("<section id='checks' data-section='checks'><h2>Checks</h2><p>Jepsen-style checkers over the history: "
            "each passes, fails with the events that violate it, or is unknown (with the reason or the checker's "
            "error).</p><table><thead><tr><th>Checker</th><th>Verdict</th><th>Evidence</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table></section>")


def _provenance_section(art: dict[str, Any]) -> str:
    blocks = []
    for r in art["runs"]:
        p = r["provenance"]
        rev = p["code_revision"]
        rev_txt = (f"{escape(str(rev.get('commit')))}{' (uncommitted changes)' if rev.get('dirty') else ''}"
                   if rev.get("commit") else f"{ev('unavailable')} {escape(str(rev.get('reason', '')))}")
        rt = p.get("runtime", {})
        hashes = "".join(f"<tr><td><code>{escape(k)}</code></td><td class='hash'>{escape(v)}</td></tr>"
                         for k, v in p["input_hashes"].items())
        key = _key(r)
        scen = p.get("scenario") or {}
        blocks.append(
            f"<details id='prov-{key}'><summary>{escape(r['policy'])} — {escape(r['run_id'])}</summary><table>"
            f"<tr><th>Code revision</th><td class='hash'>{rev_txt}</td></tr>"
            f"<tr><th>Dataset id (sha256 of the text)</th><td class='hash'>{escape(str(p.get('dataset_id')))}</td></tr>"
            f"<tr><th>Runtime</th><td>Python {escape(str(rt.get('python')))}, torch {escape(str(rt.get('torch')))}, "
            f"device {escape(str(rt.get('device')))}, {escape(str(rt.get('platform', '')))}</td></tr>"
            f"<tr><th>Scenario</th><td>{escape(str(scen.get('name')))} <span class='hash'>{escape(str(scen.get('sha256')))}"
            f"</span></td></tr><tr><th>Policy / mode</th><td>{escape(r['policy'])} / {escape(r['mode'])}</td></tr>"
            f"<tr><th>Model</th><td>{p.get('n_params') or 0:,} parameters; "
            f"{(p['flops_per_token']['value'] or 0):,.0f} FLOP/token{ev(p['flops_per_token']['evidence'])}</td></tr>"
            f"<tr><th>Events</th><td>{r['n_events']:,}{ev('measured')}</td></tr></table>"
            f"<table><thead><tr><th>Input</th><th>sha256</th></tr></thead><tbody>{hashes}</tbody></table>"
            f"<div class='trace' id='trace-{key}'><button type='button' data-src='traces/{key}.js' "
            "onclick='xdcLoadTrace(this)'>Load the raw event trace</button> <span class='trace-status'>not loaded"
            "</span> <input type='search' placeholder='filter by event or id' hidden> <table hidden><thead><tr>"
            "<th>id</th><th>event</th><th>process</th><th>wall_ns</th><th>epoch</th><th>fields</th></tr></thead>"
            "<tbody></tbody></table></div></details>")
    return ("<section id='provenance' data-section='provenance'><h2>Provenance</h2>"
            f"<p>Artifact schema <code>{escape(art['schema'])}</code>; generated by {escape(art['generated']['by'])} "
            f"in {art['generated'].get('analysis_s')} s. Each run: code revision, dataset identity, runtime, "
            "scenario and the sha256 of every input the analysis read. Raw traces load on demand.</p>"
            + "".join(blocks) + "</section>")


# ----------------------------------------------------------------------------------------- writing
def write_traces(histories: list[RunHistory], art: dict[str, Any], out_dir: Path) -> None:
    """Each run's raw log lines, verbatim, wrapped in one JS call (loaded by a <script> tag on demand).

    The lines are copied as bytes, not re-encoded: they already are JSON objects. The page sorts
    them by wall clock when it loads them.
    """
    (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    keys = {r["run_id"]: _key(r) for r in art["runs"]}
    for h in histories:
        key = keys[h.run_id]
        total = h.n_events()
        kept = 0
        path = out_dir / "traces" / f"{key}.js"
        with open(path, "wb") as out:
            out.write(f"window.xdcTraceLoaded({json.dumps(key)}, ".encode())
            meta_pos = out.tell()
            out.write(b" " * 80 + b", [")  # room for the meta object, written once the count is known
            first = True
            for p in sorted((h.run_dir / "logs").glob("*.jsonl")):
                with open(p, "rb") as f:
                    for line in f:
                        line = line.strip()
                        if not line or kept >= MAX_TRACE_EVENTS:
                            continue
                        if not (line.startswith(b"{") and line.endswith(b"}")):
                            continue  # a torn or malformed line (the log_integrity check reports it)
                        out.write(line if first else b"," + line)
                        first = False
                        kept += 1
            out.write(b"]);\n")
            meta = json.dumps({"total": total, "truncated": kept < total}).encode()
            out.seek(meta_pos)
            out.write(meta.ljust(80))


def render_report(art: dict[str, Any]) -> str:
    from plotly.offline import get_plotlyjs

    scen = art.get("scenario") or {}
    title = f"xdc report — {scen.get('name', art['runs'][0]['run_id'])}"
    nav = "".join(f"<a href='#{s}'>{s}</a>" for s in SECTIONS)
    body = (_recovery_section(art) + _work_section(art) + _bytes_section(art) + _completion_section(art)
            + _learning_section(art) + controller_section_html(art, _fig_html) + energy_section_html(art)
            + _checks_section(art) + _provenance_section(art))
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style>"
            f"<script>{get_plotlyjs()}</script><script>{TRACE_JS}</script></head><body>"
            f"<header><h1>Can a training run survive across flaky datacenters?</h1>"
            f"<p>{escape(title)} · measured on this machine by xdc, from the runs' structured logs.</p>"
            f"{_lede(art)}<nav>{nav}</nav></header>{body}</body></html>")


def write_report(art: dict[str, Any], histories: list[RunHistory], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_traces(histories, art, out_dir)
    write_energy_traces(histories, art, out_dir)
    path = out_dir / "index.html"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(render_report(art), encoding="utf-8")
    tmp.replace(path)
    return path
