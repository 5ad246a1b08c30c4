"""The page `xdc sim report` writes: "How the simulator works", as on the seed page.

Built from the two artifacts (the emulator's comparison, `measured`; the simulator's, `modeled`)
and the side-by-side document (sim/side_by_side.py: claims and the simulator's manifest). Every
value carries its evidence class as a text badge (colour never says it alone); the causal graph and
the timeline each have an accessible list beside the drawing.
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path
from typing import Any

from analysis.figures import timeline_figure
from analysis.report import CSS
from analysis.report_cells import ev, fig_html

LN256 = math.log(256)

# Published observations the simulator's sweeps may be screened against (never fitted to), read from
# a data file (sim/published_observations.json) that the page and the published record both cite.
PUBLISHED_PATH = Path(__file__).with_name("published_observations.json")


def published_observations() -> dict[str, Any]:
    return json.loads(PUBLISHED_PATH.read_text())


def _v(run: dict[str, Any] | None, key: str) -> tuple[Any, str]:
    if run is None:
        return None, "unavailable"
    q = run.get("duration") if key == "duration" else run["metrics"].get(key)
    q = q or {}
    return q.get("value"), q.get("evidence", "unavailable")


def _cell(value: Any, evidence: str, fmt: str = ",.0f", unit: str = "") -> str:
    if value is None:
        return f"<td class='num'>—{ev('unavailable' if evidence in ('measured', 'modeled') else evidence)}</td>"
    text = format(value, fmt) if isinstance(value, (int, float)) else escape(str(value))
    return f"<td class='num'>{text}{(' ' + escape(unit)) if unit else ''}{ev(evidence)}</td>"


def _scenario(sim_art: dict[str, Any]) -> str:
    sc = sim_art.get("scenario") or {}
    rows = "".join(
        f"<tr><td>{escape(f['kind'])}</td><td>{escape(str(f.get('target', '')))}</td>"
        f"<td>{escape(', '.join(f'{k} {f[k]:,}' for k in ('at_useful_tokens', 'at_step', 'at_s') if k in f))}</td>"
        f"<td class='num'>{escape(str(f.get('duration_s', '—')))}</td></tr>" for f in sc.get("faults", []))
    sites = sim_art["runs"][0]["sites"] if sim_art.get("runs") else []
    return (f"<section id='scenario'><h2>The scenario</h2><p><b>{escape(sc.get('name', 'no faults'))}</b>: "
            f"{escape(sc.get('description', ''))} {len(sites)} sites ({escape(', '.join(sites))}), the same scenario "
            f"file and config for the emulator and the simulator.</p>"
            + (f"<table><tr><th>fault</th><th>target</th><th>trigger</th><th>duration (s)</th></tr>{rows}</table>"
               if rows else "<p>No faults.</p>") + "</section>")


def _graph_nodes(doc: dict[str, Any], sim_art: dict[str, Any]) -> tuple[list[tuple[str, str, str]], ...]:
    params = (doc["manifest"].get("model") or {}).get("parameters", {})
    learning = doc["manifest"].get("learning") or {}
    cfg = sim_art["runs"][0].get("config", {}) if sim_art.get("runs") else {}
    link = ((cfg.get("wan") or {}).get("site_link") or {}).get("up") or {}
    inputs = [("link latency / bandwidth", f"{link.get('latency_ms', '?')} ms, "
               f"{link.get('bandwidth_kbps') or 'unlimited'} KB/s per direction (the run's config)", "prior"),
              ("fault schedule", "the scenario file, triggers by progress or time", "prior")]
    for name, p in sorted(params.items()):
        inputs.append((name, f"{p.get('value')} ({p.get('source', '')})", p.get("evidence", "prior")))
    inputs.append(("learning curve", learning.get("source", ""), learning.get("evidence", "prior")))
    mechanisms = [("membership, recovery plans, commits", "the coordinator's own pure core (coordinator/core.py): "
                   "the same code as the emulator, not a copy", "modeled"),
                  ("inner steps", "compute time per token x tokens per step", "modeled"),
                  ("collective", "direct reduce-scatter + all-gather over the modeled links", "modeled"),
                  ("failure detection", "heartbeat timeout and lost connections, on the virtual clock", "modeled"),
                  ("checkpoint write / read, state transfer, process start", "bytes over modeled rates + fixed costs",
                   "modeled")]
    outputs = [("time to target", "virtual seconds to the target useful tokens", "modeled"),
               ("idle time, lost and replayed tokens", "from the same ledgers as the emulator's", "modeled"),
               ("held-out NLL", "the learning curve at the useful tokens reached", learning.get("evidence", "prior")),
               ("inter-site bytes by class", "the WAN endpoints' counters: payload + per-message framing, acks, "
                "control and telemetry messages (sim/wan_bytes.py)", "modeled")]
    return inputs, mechanisms, outputs


EDGES = [("link latency / bandwidth", "collective"), ("collective", "time to target"),
         ("compute_s_per_token", "inner steps"), ("inner steps", "time to target"),
         ("fault schedule", "failure detection"), ("failure detection", "membership, recovery plans, commits"),
         ("membership, recovery plans, commits", "idle time, lost and replayed tokens"),
         ("checkpoint write / read, state transfer, process start", "time to target"),
         ("learning curve", "held-out NLL"), ("membership, recovery plans, commits", "time to target")]


def _causal(doc: dict[str, Any], sim_art: dict[str, Any]) -> str:
    cols = _graph_nodes(doc, sim_art)
    heads = ("inputs", "mechanisms", "outputs")
    grid = "".join(
        f"<div class='gcol'><h3>{h}</h3>" + "".join(
            f"<div class='gnode'><b>{escape(n)}</b>{ev(e)}<br><small>{escape(str(d))}</small></div>"
            for n, d, e in col) + "</div>" for h, col in zip(heads, cols))
    names = {n for col in cols for n, _d, _e in col}
    edges = "".join(f"<li>{escape(a)} → {escape(b)}</li>" for a, b in EDGES if a in names and b in names)
    return ("<section id='causal'><h2>Causal graph: what drives what</h2><p>Inputs feed the mechanisms, the "
            "mechanisms make the outputs. Every node says its evidence class in words: <i>prior</i> (declared or "
            "guessed, not fitted), <i>modeled</i> (computed by the simulator), <i>measured</i>, <i>unavailable</i>."
            "</p><style>.graph{display:flex;gap:18px}.gcol{flex:1}.gnode{background:#fff;border:1px solid #ccc;"
            "border-radius:6px;padding:6px 9px;margin:6px 0}</style>"
            f"<div class='graph'>{grid}</div><details><summary>Accessible causal graph list</summary><ul>{edges}</ul>"
            "</details></section>")


def _timeline(emu_art: dict[str, Any], sim_art: dict[str, Any]) -> str:
    emu = {r["policy"]: r for r in emu_art["runs"]}
    runs = []
    for s in sim_art["runs"]:
        if s["policy"] in emu:
            runs.append({**emu[s["policy"]], "policy": f"{s['policy']} · emulator (measured)"})
        runs.append({**s, "policy": f"{s['policy']} · simulator (modeled)"})
    fig = timeline_figure(runs)
    def marks(r: dict[str, Any]) -> str:
        ms = r["timeline"]["marks"]
        return ", ".join(f"{m['kind']} {m['label']} at {(m['start_ns'] - r['t0_wall_ns']) / 1e9:.1f} s" for m in ms) or "none"

    items = "".join(f"<li>{escape(r['policy'])}: {escape(marks(r))}</li>" for r in runs)
    return ("<section id='timeline'><h2>Aligned experiment time</h2><p>Each policy's emulator run (wall clock, "
            "measured) above its simulation (virtual clock, modeled), seconds since each run's start: compute, "
            "collective, state transfer, checkpoint, recovery, eval, waiting; failures, restores, replays and "
            "rejoins as marks. Facility / grid events: none in these runs (not modeled).</p>"
            f"<div class='chart'>{fig_html(fig, 'sim-timeline')}</div>"
            f"<details><summary>Accessible timeline event list</summary><ul>{items}</ul></details></section>")


def _progress_per_flop(run: dict[str, Any] | None) -> tuple[float | None, str]:
    nll, e1 = _v(run, "final_heldout_nll")
    flops, _e2 = _v(run, "attempted_flops")
    if nll is None or not flops:
        return None, "unavailable"
    return (LN256 - nll) / flops, "modeled" if e1 == "measured" else e1


def _results(emu_art: dict[str, Any], sim_art: dict[str, Any], doc: dict[str, Any]) -> str:
    emu = {r["policy"]: r for r in emu_art["runs"]}
    rows = []
    for s in sim_art["runs"]:
        pol = s["policy"]
        status = [c for c in doc["claims"] if c["claim"].startswith(f"{pol}:")]
        badge = "; ".join(f"{escape(c['claim'].split(': ', 1)[1])}: <b>{escape(c['status'])}</b>" for c in status)
        for side, run in (("emulator", emu.get(pol)), ("simulator", s)):
            if run is None:
                rows.append(f"<tr><td>{escape(pol)}</td><td>{side}</td><td colspan='6'>not run</td></tr>")
                continue
            train = run.get("config", {}).get("train", {})
            h = 1 if train.get("mode") == "sync" else train.get("inner_steps_h")
            ppf, ppf_e = _progress_per_flop(run)
            by_class = (run.get("bytes") or {}).get("by_class") or {}
            inter = sum(by_class.values()) if by_class else None
            if side == "simulator" and not inter:
                inter = None  # a simulated run without byte counters (made before they were modeled), not zero bytes
            energy = (run.get("metrics") or {}).get("energy") or {}  # analysis/artifact.py: metrics.energy
            dur, dur_e = _v(run, "duration")
            rows.append(f"<tr><td>{escape(pol)}</td><td>{side}</td>{_cell(h, 'prior', 'd')}{_cell(ppf, ppf_e, '.3e', 'nats/FLOP')}"
                        f"{_cell(inter, (run.get('bytes') or {}).get('evidence', 'unavailable') if inter is not None else 'unavailable', ',.0f', 'B')}"
                        f"{_cell(dur, dur_e, ',.1f', 's')}{_cell(energy.get('value'), energy.get('evidence', 'unavailable'), ',.0f', 'J')}"
                        f"<td>{badge if side == 'simulator' else ''}</td></tr>")
    return ("<section id='results'><h2>Simulator result: the methods side by side</h2>"
            "<table><tr><th>policy</th><th>side</th><th>local steps / decision</th><th>progress per FLOP</th>"
            "<th>inter-site bytes</th><th>time to target</th><th>base + compute energy</th><th>falsifier status</th>"
            f"</tr>{''.join(rows)}</table>{_claims(doc)}</section>")


def _claims(doc: dict[str, Any]) -> str:
    rows = "".join(f"<tr><td>{escape(c['claim'])}</td><td>{escape(c['falsifier'])}</td>"
                   f"<td class='{ {'survived': 'pass', 'falsified': 'fail'}.get(c['status'], 'unknown')}'>"
                   f"{escape(c['status'])}</td><td>{escape(c['detail'])}</td></tr>" for c in doc["claims"])
    n = {k: sum(c["status"] == k for c in doc["claims"]) for k in ("survived", "falsified", "not run")}
    return (f"<h3>Claims and their falsifiers</h3><p>{n['survived']} survived, {n['falsified']} falsified, "
            f"{n['not run']} not run.</p><table><tr><th>claim</th><th>falsifier (the emulator observation that "
            f"would refute it)</th><th>status</th><th>detail</th></tr>{rows}</table>")


def _learning(emu_art: dict[str, Any], doc: dict[str, Any]) -> str:
    ln = doc["manifest"].get("learning") or {}
    fitted = ln.get("evidence") not in (None, "prior")
    sd = ln.get("uncertainty") or {}
    consts = ", ".join(f"{k} = {v:.4g}" + (f" ± {sd[k]:.2g} (1 sd)" if k in sd else "")
                       for k, v in ln.items() if k in ("start_nll", "floor_nll", "scale_tokens", "alpha",
                                                       "h_penalty_per_doubling") and isinstance(v, (int, float)))
    if ln.get("rmse_nats") is not None:
        consts += f"; fit RMSE {ln['rmse_nats']:.3f} nats over {ln.get('n_points')} evaluations"
    nll = [f"{r['policy']} {r['metrics']['final_heldout_nll']['value']:.3f}" for r in emu_art["runs"]
           if (r["metrics"].get("final_heldout_nll") or {}).get("value") is not None]
    return ("<section id='learning-guess'><h2>Where the learning guess came from</h2>"
            f"<p>{ev(ln.get('evidence', 'prior'))} {'fitted' if fitted else 'PRIOR · NOT FITTED'}: "
            f"{escape(ln.get('source', ''))}</p><p>Constants: {escape(consts)}.</p>"
            f"<p>The emulator measured final held-out NLL {escape('; '.join(nll) or 'none')} {ev('measured')}; the "
            "simulator's NLL is this curve read at the useful tokens it reached, so a simulated learning "
            "difference between policies is only as good as the curve: the curve knows nothing of this model's "
            "staleness at these H values beyond its penalty constant.</p></section>")


def _published() -> str:
    doc = published_observations()
    rows = "".join(f"<tr><td>{escape(p['observation'])}</td><td class='num'>{escape(p['value'])}{ev('prior')}</td>"
                   f"<td>{escape(p['rounding'])}</td><td>{escape(p['variance'])}</td><td>{escape(p['source'])}</td>"
                   "<td>screening prior for sweeps; never fitted to</td></tr>" for p in doc["observations"])
    return ("<section id='published'><h2>Published observations</h2><p>Uncertainty from the papers' rounding is "
            "kept apart from run-to-run variation (which they do not report). Read from "
            f"<code>sim/{PUBLISHED_PATH.name}</code>.</p><table><tr><th>observation</th>"
            "<th>value</th><th>rounding uncertainty</th><th>run-to-run variance</th><th>source</th><th>action</th>"
            f"</tr>{rows}</table></section>")


def _boundary(emu_art: dict[str, Any], doc: dict[str, Any]) -> str:
    sites = len(emu_art["runs"][0]["sites"]) if emu_art.get("runs") else 0
    kinds = sorted({f["kind"] for f in (emu_art.get("scenario") or {}).get("faults", [])}) or ["none"]
    not_modeled = "; ".join(doc["manifest"].get("not_modeled", []))
    return ("<section id='boundary'><h2>Transfer boundary</h2><p>What this comparison supports: the simulator "
            f"against the emulator at {sites} sites, one model size, the fault kinds {', '.join(kinds)}, on one "
            "2-core machine's timing. It says nothing about more sites than that (the rules are the same code, "
            "the timing model is not validated there), other model sizes or devices, link profiles or fault "
            "kinds the emulator did not run here, progress per FLOP at other H, or energy. Not modeled: "
            f"{escape(not_modeled)}.</p></section>")


def _ledger(emu_art: dict[str, Any], sim_art: dict[str, Any]) -> str:
    rows = []
    for art, side in ((emu_art, "emulator"), (sim_art, "simulator")):
        for r in art["runs"]:
            prev = None
            for c in r.get("commit_ledger", []):
                key = (tuple(c.get("members") or ()), c.get("mode"), c.get("inner_steps_h"))
                if prev is not None and key == prev and not c.get("action"):
                    continue
                observed = (f"members {', '.join(c.get('members') or [])}"
                            + (f"; stress {c['stress']}" if c.get("stress") else ""))
                decision = c.get("action") or ("membership changed" if c.get("membership_changed") else "settings")
                reason = c.get("action_reason") or c.get("setting_source") or ""
                rows.append(f"<tr><td>{side} {escape(r['policy'])}</td><td>{escape(c['commit_id'])}</td>"
                            f"<td>{escape(observed)}</td><td>{escape(str(decision))} ({escape(str(reason))})</td>"
                            f"<td>epoch {c.get('epoch')}: {escape(str(c.get('mode')))} H={c.get('inner_steps_h')}</td>"
                            f"<td>{ev(c.get('evidence', 'measured') if side == 'emulator' else 'modeled')}</td></tr>")
                prev = key
    return ("<section id='ledger'><h2>Policy decision ledger</h2><p>Each commit after which the membership or the "
            "consistency setting changed (or the controller acted): the coordinator reads one finished "
            "communication cycle, then the next epoch applies the decision.</p><table><tr><th>run</th><th>after</th>"
            "<th>observed state</th><th>decision</th><th>applies to</th><th>evidence</th></tr>"
            f"{''.join(rows)}</table></section>")


def render(emu_art: dict[str, Any], sim_art: dict[str, Any], doc: dict[str, Any]) -> str:
    from plotly.offline import get_plotlyjs

    body = (_scenario(sim_art) + _causal(doc, sim_art) + _timeline(emu_art, sim_art)
            + _results(emu_art, sim_art, doc) + _learning(emu_art, doc) + _published() + _boundary(emu_art, doc)
            + _ledger(emu_art, sim_art))
    prov = "".join(f"<li>{k}: <code>{v}</code></li>" for k, v in doc["artifacts_sha256"].items())
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'><title>xdc — how the simulator works"
            f"</title><style>{CSS}</style><script>{get_plotlyjs()}</script></head><body><header>"
            "<h1>How the simulator works</h1><p class='lede'>The simulator runs the emulator's own membership, "
            "recovery and commit rules on a virtual clock and models what takes time. Every simulated number is "
            "<i>modeled</i>; the emulator's are <i>measured</i>; each claim below names the emulator observation "
            f"that would refute it.</p></header>{body}<section id='provenance'><h2>Provenance</h2><ul>{prov}"
            f"<li>emulator runs: <code>{escape(doc['emulator_dir'])}</code></li><li>simulated runs: "
            f"<code>{escape(doc['simulated_dir'])}</code></li></ul></section></body></html>")
