"""The report's controller section: what the adaptive controller saw, chose and preserved.

For one chosen run (the first whose settings were picked while it ran: `train.mode: adaptive`, else
`scripted`), from the artifact's `runs[].commit_ledger` (analysis/commit_ledger.py) and
`runs[].faults`:
- the setting intervals (mode, inner steps H, compression) on the report's shared time axis
  (seconds since the run's first event, as in the recovery timeline), marked with the events that
  explain them: WAN faults injected, membership shrinking or growing (a rejoin), abstentions and
  changes. Every mark has its own symbol and name, never colour alone;
- an accessible table of the same decisions (every change and abstention, with its reason);
- the commit ledger table (every commit; long ledgers are folded).
Every number here carries the evidence class of its run (`measured` from the logs of an emulator run,
`modeled` for a simulated one); a missing one is shown as unavailable.
"""

from __future__ import annotations

from html import escape
from typing import Any

import plotly.graph_objects as go

from analysis.report_cells import ev as _ev
from analysis.report_cells import fig_html, run_evidence

LEDGER_ROWS_SHOWN = 400  # a longer ledger is cut in the page (the artifact and `xdc sql` hold all of it)
MARKS = {  # kind -> (symbol, legend name); shapes differ so no mark depends on colour
    "fault": ("x", "WAN / fault injected"),
    "shrink": ("triangle-down", "membership shrank"),
    "rejoin": ("triangle-up", "membership grew (rejoin)"),
    "abstain": ("circle-open", "controller abstained"),
    "change": ("diamond", "setting changed"),
}


def setting_label(row: dict[str, Any]) -> str:
    """'sync', 'local H=16' or 'local H=16 int8' for a ledger row."""
    if row.get("mode") == "sync":
        text = "sync"
    else:
        text = f"local H={row.get('inner_steps_h')}"
    comp = row.get("compression")
    return text + (f" {comp}" if comp and comp != "none" else "")


def chosen_run(art: dict[str, Any]) -> dict[str, Any] | None:
    """The run the section is about: the first adaptive one, else the first scripted one."""
    for source in ("adaptive", "scripted"):
        for r in art.get("runs", []):
            if any(row.get("setting_source") == source for row in r.get("commit_ledger") or []):
                return r
    return None


def _t(run: dict[str, Any], wall_ns: Any) -> float | None:
    return None if wall_ns is None else (int(wall_ns) - int(run["t0_wall_ns"])) / 1e9


def setting_intervals(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Maximal runs of consecutive commits in one setting: [start_s, end_s], rounds and label.
    An interval starts where the previous one's last commit ended (or at 0) and ends at its own
    last commit: the rounds between those commits were trained in that setting."""
    out: list[dict[str, Any]] = []
    prev_end = 0.0
    for row in run.get("commit_ledger") or []:
        t = _t(run, row.get("wall_ns"))
        if t is None:
            continue
        label = setting_label(row)
        if out and out[-1]["label"] == label:
            out[-1].update(end_s=t, last_round=row["round"], commits=out[-1]["commits"] + 1)
        else:
            out.append({"label": label, "start_s": prev_end, "end_s": t, "first_round": row["round"],
                        "last_round": row["round"], "commits": 1})
        prev_end = t
    return out


def marks(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The events drawn on the axis: faults, membership changes, abstentions, changes (time order)."""
    out: list[dict[str, Any]] = []
    for f in run.get("faults") or []:
        out.append({"kind": "fault", "t_s": f.get("t_s"), "text": f"{f.get('kind')} {f.get('target') or ''}".strip()})
    prev: list[str] | None = None
    for row in run.get("commit_ledger") or []:
        t = _t(run, row.get("wall_ns"))
        members = list(row.get("members") or [])
        if prev is not None and members != prev:
            kind = "rejoin" if len(members) > len(prev) else "shrink"
            out.append({"kind": kind, "t_s": t, "text": f"round {row['round']}: members {', '.join(members)}"})
        prev = members
        if row.get("action") in ("abstain", "change"):
            out.append({"kind": row["action"], "t_s": t,
                        "text": f"after round {row['round']}: {row.get('action_reason') or ''}"})
    return sorted((m for m in out if m["t_s"] is not None), key=lambda m: m["t_s"])


def controller_figure(run: dict[str, Any]) -> go.Figure:
    """One bar row per setting (its label written on the bar), one row of event marks."""
    fig = go.Figure()
    for iv in setting_intervals(run):
        fig.add_trace(go.Bar(
            y=[iv["label"]], x=[max(iv["end_s"] - iv["start_s"], 1e-3)], base=[iv["start_s"]], orientation="h",
            text=[f"{iv['label']} (rounds {iv['first_round']}-{iv['last_round']})"], textposition="inside",
            name=iv["label"], showlegend=False,
            hovertemplate=f"{escape(iv['label'])}: %{{base:.1f}} s to {iv['end_s']:.1f} s<extra></extra>"))
    ms = marks(run)
    for kind, (symbol, name) in MARKS.items():
        pts = [m for m in ms if m["kind"] == kind]
        if pts:
            fig.add_trace(go.Scatter(x=[m["t_s"] for m in pts], y=["events"] * len(pts), mode="markers", name=name,
                                     marker={"symbol": symbol, "size": 11, "line": {"width": 1}},
                                     text=[m["text"] for m in pts], hovertemplate="%{x:.1f} s: %{text}<extra></extra>"))
    fig.update_layout(barmode="overlay", height=260, margin={"l": 10, "r": 10, "t": 10, "b": 40},
                      xaxis_title="seconds since the run's first event (shared time axis)",
                      legend={"orientation": "h"})
    return fig


def _num(v: Any, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def decisions_table(run: dict[str, Any]) -> str:
    ledger = run.get("commit_ledger") or []
    decided = [r for r in ledger if r.get("action") in ("change", "abstain")]
    keeps = sum(1 for r in ledger if r.get("action") == "keep")
    rows = "".join(
        f"<tr><td class='num'>{r['round']}</td><td class='num'>{_num(_t(run, r.get('wall_ns')), '.1f')}</td>"
        f"<td>{escape(r['action'])}</td><td>{escape(setting_label(r))}</td>"
        f"<td>{escape(', '.join(r.get('stress') or []) or 'none')}</td><td>{escape(str(r.get('action_reason') or ''))}</td></tr>"
        for r in decided)
    return (f"<p>{len(decided)} decisions changed the setting or abstained; {keeps} kept it (not listed). "
            f"{_ev(run_evidence(run))}</p><table data-table='controller-decisions'><thead><tr><th>After round</th>"
            "<th>t (s)</th><th>Action</th><th>Setting the round ran in</th><th>Stress then</th><th>Reason</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>")


LEDGER_COLUMNS = ("round", "t (s)", "epoch", "setting", "source", "action", "members", "stress", "update age (steps)",
                  "cos to mean", "useful tokens", "attempted tokens", "replayed tokens", "WAN payload (B)",
                  "WAN time (s)", "held-out NLL", "in lineage")


def ledger_table(run: dict[str, Any]) -> str:
    ledger = run.get("commit_ledger") or []
    shown = ledger[:LEDGER_ROWS_SHOWN]
    rows = []
    for r in shown:
        cells = [str(r["round"]), _num(_t(run, r.get("wall_ns")), ".1f"), str(r["epoch"]), setting_label(r),
                 str(r.get("setting_source")), str(r.get("action") or "—"), ", ".join(r.get("members") or []),
                 ", ".join(r.get("stress") or []) or "none", str(r.get("update_age_steps")),
                 _num(r.get("cos_to_mean"), ".3f"), _num(r.get("useful_tokens"), ","),
                 _num(r.get("attempted_tokens"), ","), _num(r.get("replayed_tokens"), ","),
                 _num(r.get("wan_payload_bytes"), ","), _num(r.get("wan_time_s"), ".3f"),
                 _num(r.get("heldout_nll"), ".4f"), "yes" if r.get("in_lineage") else "no"]
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    cut = (f"<p>The first {LEDGER_ROWS_SHOWN} of {len(ledger)} commits; the artifact and <code>xdc sql</code> "
           f"(view <code>ledger</code>) hold all of them.</p>" if len(ledger) > LEDGER_ROWS_SHOWN else "")
    head = "".join(f"<th>{escape(c)}</th>" for c in LEDGER_COLUMNS)
    return (f"<details><summary>Optimizer-commit ledger of {escape(run['run_id'])}: {len(ledger)} commits "
            f"{_ev(run_evidence(run))}</summary>{cut}<table data-table='commit-ledger'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table></details>")


def controller_section_html(art: dict[str, Any]) -> str:
    """The section (its figure rendered by report_cells.fig_html, like the rest of the page)."""
    head = "<section id='controller' data-section='controller'><h2>Can a controller pick the settings by itself?</h2>"
    run = chosen_run(art)
    if run is None:
        first = next((r for r in art.get("runs", []) if r.get("commit_ledger")), None)
        return (head + "<p data-controller='none'>No run in this report chose its consistency settings while it ran "
                "(<code>train.mode: adaptive</code> or <code>scripted</code>): every commit used one fixed setting, "
                "so there is no controller to show.</p>" + (ledger_table(first) if first else "") + "</section>")
    ivs = setting_intervals(run)
    source = next(r["setting_source"] for r in run["commit_ledger"] if r.get("setting_source") in ("adaptive", "scripted"))
    words = ", then ".join(f"{iv['label']} (rounds {iv['first_round']}-{iv['last_round']})" for iv in ivs)
    return (head + f"<p data-controller='{escape(source)}'>Run <b>{escape(run['run_id'])}</b> "
            f"({escape(run.get('policy', ''))}, settings {escape(source)}) trained in {len(ivs)} setting "
            f"interval{'s' if len(ivs) != 1 else ''}: {escape(words)}. {_ev(run_evidence(run))}</p>"
            f"<div class='chart' data-chart='controller'>{fig_html(controller_figure(run), 'chart-controller')}</div>"
            + decisions_table(run) + ledger_table(run) + "</section>")
