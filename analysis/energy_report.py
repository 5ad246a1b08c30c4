"""The report's energy section, from the artifact's `runs[].energy` (analysis/energy.py).

Validity comes before any effect: which meters exist and why not, the trace's hash and whether it is
whole, the poll calibration and effective update periods, the frozen invalidators and the claims
they guard. Only then the energies: measured (or `unavailable` with the reason), `modeled` numbers
labelled as such, the idle baseline as a sensitivity, the phase table and the modeled per-site split.
The raw point trace is written next to the page and loaded on demand (point, time, phase at
timestamp, every sensor's value).
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from analysis.energy import machine_timeline, phase_at, run_trace, site_phases
from analysis.load import RunHistory

MAX_TRACE_POINTS = 20_000
ENERGY_TRACES = "energy_traces"  # beside the report's traces/ (which holds one event trace per run)

ENERGY_TRACE_JS = """
window.xdcEnergyTraceLoaded = function (key, cols, rows) {
  var box = document.getElementById('etrace-' + key);
  box.querySelector('.trace-status').textContent = rows.length.toLocaleString() + ' points loaded';
  var t = box.querySelector('table'); var head = t.querySelector('thead tr'); head.innerHTML = '';
  cols.forEach(function (c) { var th = document.createElement('th'); th.textContent = c; head.appendChild(th); });
  var tb = t.querySelector('tbody'); tb.innerHTML = '';
  rows.slice(0, 500).forEach(function (r) { var tr = document.createElement('tr');
    r.forEach(function (v) { var td = document.createElement('td'); td.textContent = v === null ? '—' : String(v);
      tr.appendChild(td); }); tb.appendChild(tr); });
  t.hidden = false;
};
"""


def _ev(evidence: str) -> str:
    return f'<span class="ev ev-{escape(evidence)}">{escape(evidence)}</span>'


def _qty(q: dict[str, Any] | None, fmt: str = ".3f") -> str:
    if not q:
        return f"<td class='num'>—{_ev('unavailable')}</td>"
    v = q.get("value")
    text = "—" if v is None else format(v, fmt)
    extra = " (sensitivity)" if q.get("sensitivity") else ""
    title = escape(str(q.get("reason") or q.get("derived") or ""))
    return f"<td class='num' title='{title}'>{text} {escape(q.get('unit', ''))}{_ev(q['evidence'])}{extra}</td>"


def _num(v: Any, fmt: str = ".1f") -> str:
    return f"<td class='num'>{'—' if v is None else format(v, fmt)}</td>"


def _no_meter_reason(art: dict[str, Any]) -> str | None:
    """The one reason no meter was readable in any run of the page (None when a run read one): a CPU-only
    machine says it once per page, not once per sensor, claim and run."""
    reasons = set()
    for r in art["runs"]:
        meters = (r.get("energy") or {}).get("meters") or []
        if any(m.get("evidence") == "measured" for m in meters):
            return None
        reasons |= {str(m.get("reason")) for m in meters if m.get("reason")}
    return "; ".join(sorted(reasons)) if reasons else None


def _run_block(r: dict[str, Any], no_meter: str | None = None) -> str:
    e = r.get("energy") or {}
    key = "".join(c if c.isalnum() or c in "-_" else "_" for c in r["run_id"])
    if not e.get("sampler", {}).get("ran"):
        return (f"<h3>{escape(r['policy'])} — {escape(r['run_id'])}</h3><p data-energy='absent'>"
                f"{_ev('unavailable')} {escape(str(e.get('reason', 'no energy section')))}</p>")
    tr = e.get("trace") or {}
    v = e.get("validity") or {}
    poll = v.get("poll") or {}
    meters = "".join(
        f"<tr><td><code>{escape(m['sensor'])}</code></td><td>{escape(m['quantity'])}</td><td>{escape(m['kind'])}</td>"
        f"<td>{_ev(m['evidence'])}</td><td>{escape(m['support'])}{' — lost mid-run' if m.get('disappeared') else ''}"
        f"</td><td>{escape('no meter readable (above)' if no_meter and m.get('reason') else str(m.get('reason') or m.get('note') or ''))}</td>"
        f"{_num(m.get('effective_update_period_ms'))}<td class='num'>{m.get('changes', 0)} / {m.get('polls', 0)}</td></tr>"
        for m in e.get("meters", []))
    inv = "".join(
        f"<tr data-invalidator='{escape(i['id'])}'><td><code>{escape(i['id'])}</code></td><td>{escape(i['rule'])}</td>"
        f"{_num(i.get('observed'), '.1f')}<td class='{'fail' if i['fired'] else 'pass'}'>"
        f"{'fired' if i['fired'] else 'held'}</td><td>{escape(', '.join(i['guards']))}</td></tr>"
        for i in v.get("invalidators", []))
    claims = "".join(
        f"<tr data-claim='{escape(c['claim'])}'><td>{escape(c['claim'])}</td><td class='"
        f"{'pass' if c['status'] == 'stands' else 'unknown'}'>{escape(c['status'])}</td>"
        f"<td>{escape('no meter readable (above)' if no_meter and no_meter in str(c['reason']) else c['reason'])}</td></tr>"
        for c in e.get("claims", []))
    diag = "" if e.get("evidence") == "measured" else " (diagnostic: no measured claim stands)"
    phases = "".join(
        f"<tr data-phase='{escape(p['phase'])}'><td>{escape(p['phase'])}</td><td>{escape(p['claim'])}</td>"
        f"{_qty(p['duration'], '.2f')}{_qty(p['energy'])}{_qty(p['energy_per_token'], '.3e')}{_qty(p['energy_modeled'])}"
        f"{_qty(p['energy_modeled_per_token'], '.3e')}{_num(p.get('counter_updates'), 'd')}"
        f"{_num(p.get('effective_update_equivalents'))}{_num(p.get('modeled_updates'), 'd')}{_qty(p['idle_subtracted'])}</tr>"
        for p in e.get("phases", []))
    re_ = e.get("run_energy", {})
    site = e.get("per_site") or {}
    site_rows = "".join(f"<tr><td>{escape(k)}</td>{_qty(q)}{_num(q.get('cpu_s'), '.2f')}</tr>"
                        for k, q in (site.get("processes") or {}).items())
    idle = e.get("idle_baseline", {})
    idle_rows = "".join(f"<tr><td>{escape(kind)}</td><td>{escape(stage)}</td>{_qty(q)}</tr>"
                        for kind, rows in idle.items() for stage, q in rows.items())
    problems = "".join(f"<li>{escape(p)}</li>" for p in [*tr.get("problems", []), *tr.get("sensors_lost", [])])
    return (
        f"<h3>{escape(r['policy'])} — {escape(r['run_id'])}</h3>"
        f"<p class='verdict' data-energy-evidence='{escape(e['evidence'])}' data-energy-gate='{escape(e['gate']['status'])}'>"
        f"<b>Energy evidence: {escape(e['evidence'])}.</b> "
        f"{escape('No meter readable (above)' if no_meter and no_meter in str(e.get('reason')) else str(e.get('reason')))}. Energy gate: "
        f"<b>{escape(e['gate']['status'])}</b> ({escape(e['gate']['reason'])}).</p>"
        "<h4>Validity before effect size</h4>"
        f"<p>Raw trace <code>{escape(tr.get('path', ''))}</code>: {tr.get('points', 0):,} points, SHA-256 "
        f"<span class='hash' data-trace-sha256='{escape(str(tr.get('sha256')))}'>{escape(str(tr.get('sha256')))}</span>"
        f" ({'matches' if tr.get('hash_matches') else 'does NOT match'} the sampler's; "
        f"{'truncated' if tr.get('truncated') else 'whole'}).</p>"
        + (f"<ul class='fail' data-trace-problems>{problems}</ul>" if problems else "")
        + f"<p>Logger calibration: asked every {poll.get('period_ms')} ms, achieved "
        f"{(poll.get('achieved_rate_hz') or 0):.1f} Hz of {(poll.get('target_rate_hz') or 0):.1f} Hz; interval median "
        f"{poll.get('interval_median_ms') or 0:.1f} ms, p95 {poll.get('interval_p95_ms') or 0:.1f} ms, max "
        f"{poll.get('interval_max_ms') or 0:.1f} ms; {poll.get('late_polls', 0)} intervals over 1.5 periods, {tr.get('missed_polls')} scheduled polls skipped. Sampler CPU "
        f"{round(tr.get('sampler_cpu_s') or 0, 2)} s.{_ev('measured')}</p>"
        + ("<details><summary>Sensors, invalidators and claims (none measured: no meter readable)</summary>"
           if no_meter else "")
        + "<table><thead><tr><th>Sensor</th><th>Quantity</th><th>Kind</th><th>Class</th><th>Support</th><th>Why / source</th>"
        "<th>Effective update period (ms)</th><th>Changes / polls</th></tr></thead><tbody>" + meters + "</tbody></table>"
        "<table><thead><tr><th>Frozen invalidator</th><th>Rule</th><th>Observed</th><th>Status</th><th>Guards</th></tr>"
        "</thead><tbody>" + inv + "</tbody></table>"
        "<table><thead><tr><th>Claim</th><th>Status</th><th>Why</th></tr></thead><tbody>" + claims + "</tbody></table>"
        + ("</details>" if no_meter else "") +
        "<h4>Run energy</h4><table><thead><tr><th>Measured</th><th>Modeled</th><th>Idle-subtracted (sensitivity)</th>"
        f"</tr></thead><tbody><tr>{_qty(re_.get('measured'))}{_qty(re_.get('modeled'))}{_qty(re_.get('idle_subtracted'))}"
        "</tr></tbody></table>"
        f"<p>Modeled: {escape(str((re_.get('modeled') or {}).get('derived', '')))}. A modeled number never passes an "
        "energy gate.</p>"
        "<details><summary>Idle baseline (before and after the run, same sensors)</summary><table><thead><tr><th>Meter</th>"
        f"<th>Window</th><th>Mean power</th></tr></thead><tbody>{idle_rows}</tbody></table></details>"
        f"<h4>Phases{escape(diag)}</h4><p>{escape(e.get('attribution_rule', ''))}.</p>"
        "<table data-energy-phases><thead><tr><th>Phase</th><th>Claim</th><th>Duration</th><th>Energy</th>"
        "<th>Energy / canonical token</th><th>Modeled energy</th><th>Modeled / canonical token</th><th>Counter updates</th>"
        "<th>Effective update equivalents</th><th>Modeled-meter updates</th><th>Idle-subtracted</th></tr></thead><tbody>"
        + phases + "</tbody></table>"
        f"<details><summary>Per-site split ({_ev('modeled')})</summary><p>{escape(str(site.get('by', 'unavailable')))}</p>"
        f"<table><thead><tr><th>Process</th><th>Modeled energy</th><th>CPU s</th></tr></thead><tbody>{site_rows}</tbody>"
        "</table></details>"
        f"<div class='trace' id='etrace-{key}'><button type='button' data-src='energy_traces/{key}.js' "
        "onclick='xdcLoadTrace(this)'>Load the raw telemetry trace</button> <span class='trace-status'>not loaded</span>"
        "<table hidden><thead><tr></tr></thead><tbody></tbody></table></div>")


def energy_section_html(art: dict[str, Any]) -> str:
    no_meter = _no_meter_reason(art)
    return ("<section id='energy' data-section='energy'><h2>Energy: can the meter be trusted, and where did it go?</h2>"
            "<p>One sampler per machine polls every meter at a fixed period. Validity is measured before any energy "
            "is read: a frozen invalidator that fires withdraws the claim it guards, and its numbers stay only as "
            "diagnostics. Without a readable meter only <i>modeled</i> numbers appear.</p>"
            f"<script>{ENERGY_TRACE_JS}</script>"
            + (f"<p class='verdict' data-no-meter>{_ev('unavailable')} <b>No energy meter was readable on this machine</b> "
               f"(said once for the page): {escape(no_meter)}. Energy below is <i>modeled</i> from CPU time, with "
               "its prior stated; the per-sensor tables are folded.</p>" if no_meter else "")
            + "".join(_run_block(r, no_meter) for r in art["runs"]) + "</section>")


def write_energy_traces(histories: list[RunHistory], art: dict[str, Any], out_dir: Path) -> None:
    """Each run's telemetry points as one JS call (loaded on demand): point, time, phase at timestamp, values."""
    (out_dir / ENERGY_TRACES).mkdir(parents=True, exist_ok=True)
    for h in histories:
        tr = run_trace(h)
        if tr is None:
            continue
        key = "".join(c if c.isalnum() or c in "-_" else "_" for c in h.run_id)
        run = [p["wall_ns"] for p in tr.points if p.get("stage") == "run"]
        tl = machine_timeline(site_phases(h), run[0], run[-1]) if len(run) >= 2 else []
        sids = [s["sensor"] for s in tr.header.get("sensors", [])]
        t0 = tr.points[0]["wall_ns"] if tr.points else 0
        rows = []
        for p in tr.points[:MAX_TRACE_POINTS]:
            ph = phase_at(tl, p["wall_ns"]) if p.get("stage") == "run" else p.get("stage")
            rows.append([p["i"], round((p["wall_ns"] - t0) / 1e9, 3), ph or "idle",
                         *[(p["v"].get(s) or [None])[0] for s in sids]])
        cols = ["point", "t (s)", "phase at timestamp", *sids]
        (out_dir / ENERGY_TRACES / f"{key}.js").write_text(
            f"window.xdcEnergyTraceLoaded({json.dumps(key)}, {json.dumps(cols)}, {json.dumps(rows)});\n")

