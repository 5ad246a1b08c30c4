"""The report's learning section: did the model still learn as well?

The verdict against the count baselines (rules: analysis/learning.py), the evaluation set's
identity, the final NLL cards, the NLL-over-time chart, the baselines table, the single-process
reference and noise floor (analysis/learning_refs.py), and the run-level table.
"""

from __future__ import annotations

from html import escape
from typing import Any

from analysis import figures
from analysis.learning import verdict
from analysis.report_cells import art_evidence, energy_cell, ev, fig_html, num, qcell, runs_evidence


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
            f"for {same}. ± is the standard error of that mean over the windows. {ev(runs_evidence(runs))}</p>")


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


def learning_section(art: dict[str, Any]) -> str:
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
                    f"{energy_cell(energy)}"
                    f"{qcell(m['active_time'], '.1f')}{qcell(r['duration'], '.1f')}</tr>")
    v = learning_verdict(art)
    learning_fig = figures.learning_figure(runs, reference=_refs(art).get("reference"))
    return (
        "<section id='learning' data-section='learning'><h2>Did the model still learn as well?</h2>"
        "<p>Lower held-out loss means the model predicts unseen text better. The lines show what each policy "
        f"learned over the same failure clock; the cards show how much training each attempted. {ev(art_evidence(art))}</p>"
        f"<p class='verdict' data-learning-verdict='{escape(v['status'])}'><b>{escape(v['text'])}</b></p>"
        f"{_eval_set_words(runs)}"
        f"<div class='cards'>{''.join(cards)}</div>"
        f"<div class='chart' data-chart='learning'>{fig_html(learning_fig, 'chart-learning')}</div>"
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
