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

The pieces: cell helpers (analysis/report_cells.py), the learning section
(analysis/report_learning.py), raw traces on demand (analysis/report_traces.py).
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from analysis import figures
from analysis.controller_report import controller_section_html
from analysis.energy_report import energy_section_html, write_energy_traces
from analysis.load import RunHistory
from analysis.report_cells import art_evidence, ev, fig_html, num, qcell, run_key
from analysis.report_learning import learning_section, learning_verdict
from analysis.report_traces import MAX_TRACE_EVENTS, TRACE_JS, write_traces

# Re-exported: importable from analysis.report as before the split.
__all__ = ["CHART_SECTIONS", "MAX_TRACE_EVENTS", "SECTIONS", "TRACE_JS", "ev", "learning_verdict", "num", "qcell",
           "recovery_title", "render_report", "write_report", "write_traces"]

SECTIONS = ("recovery", "work", "bytes", "completion", "learning", "controller", "energy", "checks", "provenance")
CHART_SECTIONS = ("recovery", "work", "bytes", "completion", "learning")

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
            + f"Lost tokens: {escape(lost)} {ev(art_evidence(art))}. Idle site-seconds: {escape(idle)} {ev(art_evidence(art))}. "
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
        f"bounds. {ev(art_evidence(art))}</p>"
        f"<div class='chart' data-chart='recovery'>{fig_html(figures.timeline_figure(runs), 'chart-recovery')}</div>"
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
        f"attempted = retained + lost, exactly. {ev(art_evidence(art))} FLOPs are derived, not read from a counter: "
        f"the FLOP/token measured once by torch's FlopCounterMode times the tokens counted {ev('modeled')}.</p>"
        f"<div class='chart' data-chart='work'>{fig_html(figures.work_figure(runs), 'chart-work')}</div>"
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
        f"framing that no class owns. {ev(art_evidence(art))}</p>"
        f"<div class='chart' data-chart='bytes'>{fig_html(figures.bytes_figure(runs), 'chart-bytes')}</div>"
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
        f"{ev(art_evidence(art))}</p>"
        f"{verdict}<div class='chart' data-chart='completion'>"
        f"{fig_html(figures.frontier_figure(runs), 'chart-completion')}</div>"
        "<table><thead><tr><th>Policy</th><th>Frontier round</th><th>Useful tokens</th><th>Matched-frontier hash</th>"
        "<th>Recomputed from the lineage</th><th>Proof</th>"
        f"<th>Manifest hash</th><th>Event</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "<details><summary>Checkpoint lineage (abandoned branches kept)</summary><table><thead><tr><th>Policy</th>"
        "<th>Checkpoint</th><th>Round</th><th>Manifest</th><th>Parent</th><th>Branch</th></tr></thead><tbody>"
        f"{''.join(tree_rows)}</tbody></table></details></section>")


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
        key = run_key(r)
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
            f"<tr><th>Events</th><td>{r['n_events']:,}{ev(art_evidence(art))}</td></tr></table>"
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


# What produced the numbers, from the artifact's own evidence class (a simulated run reads "modeled").
WHO = {"measured": "measured on this machine by xdc", "modeled": "modeled by xdc's simulator (nothing measured)",
       "mixed": "measured and modeled runs side by side (each number says which)"}


# ----------------------------------------------------------------------------------------- writing
def render_report(art: dict[str, Any]) -> str:
    from plotly.offline import get_plotlyjs

    scen = art.get("scenario") or {}
    title = f"xdc report — {scen.get('name', art['runs'][0]['run_id'])}"
    nav = "".join(f"<a href='#{s}'>{s}</a>" for s in SECTIONS)
    body = (_recovery_section(art) + _work_section(art) + _bytes_section(art) + _completion_section(art)
            + learning_section(art) + controller_section_html(art) + energy_section_html(art)
            + _checks_section(art) + _provenance_section(art))
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style>"
            f"<script>{get_plotlyjs()}</script><script>{TRACE_JS}</script></head><body>"
            f"<header><h1>Can a training run survive across flaky datacenters?</h1>"
            f"<p>{escape(title)} · {escape(WHO[art_evidence(art)] if art_evidence(art) in WHO else art_evidence(art))}, "
            "from the runs' structured logs.</p>"
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
