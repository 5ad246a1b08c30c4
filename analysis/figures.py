"""The report's charts, built with Plotly from the artifact alone (never from the logs directly).

One function per chart; each returns a `plotly.graph_objects.Figure`. Times are seconds since
each run's start (its launcher's first event), so the tracks of a comparison share one axis.
Every hover label carries the evidence class of the number it shows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

PHASE_COLORS = {
    "compute": "#4C78A8", "collective": "#F58518", "state_transfer": "#B279A2", "checkpoint": "#54A24B",
    "recovery": "#E45756", "eval": "#9D9DA1", "waiting": "#EECA3B",
}
MARK_STYLE = {  # kind -> (plotly marker symbol, colour)
    "failure": ("x-thin-open", "#D62728"), "preemption": ("triangle-down", "#8C564B"),
    "restore": ("diamond", "#17BECF"), "replay": ("circle-open", "#7F3C8D"), "rejoin": ("star", "#2CA02C"),
}
CLASS_COLORS = {
    "collective": "#4C78A8", "aborted_collective": "#E45756", "state_transfer": "#B279A2",
    "checkpoint": "#54A24B", "control": "#F58518", "telemetry": "#9D9DA1",
}
POLICY_COLORS = {"stall": "#E45756", "restart": "#F58518", "elastic": "#54A24B", "oracle": "#4C78A8"}
MAX_BARS_PER_TRACE = 4000  # above this, adjacent spans of one phase on one site are merged for drawing


def _color(policy: str, i: int) -> str:
    return POLICY_COLORS.get(policy, ["#72B7B2", "#FF9DA6", "#B279A2", "#9D755D"][i % 4])


def _phase_rows(cols: dict[str, list[Any]], t0: int, duration_ns: int) -> dict[str, dict[str, Any]]:
    """phase -> arrays for drawing. Above MAX_BARS_PER_TRACE spans of one phase, spans of one site
    closer than 1/2000 of the run are merged (drawing only: the artifact keeps every span)."""
    site = np.asarray(cols["site"], dtype=object)
    phase = np.asarray(cols["phase"], dtype=object)
    start = np.asarray(cols["start_ns"], dtype=np.int64)
    end = np.asarray(cols["end_ns"], dtype=np.int64)
    ids = np.asarray(cols["event_id"], dtype=object)
    out = {}
    for ph in PHASE_COLORS:
        sel = np.nonzero(phase == ph)[0] if len(phase) else np.array([], dtype=int)
        if not len(sel):
            continue
        s_, st, en, ii = site[sel], start[sel], end[sel], ids[sel]
        merged = np.ones(len(sel), dtype=np.int64)
        if len(sel) > MAX_BARS_PER_TRACE:
            gap = max(1, duration_ns // 2000)
            order = np.lexsort((st, s_.astype(str)))
            s_, st, en, ii = s_[order], st[order], en[order], ii[order]
            keep_s, keep_st, keep_en, keep_id, keep_n = [], [], [], [], []
            for k in range(len(st)):
                if keep_s and keep_s[-1] == s_[k] and st[k] - keep_en[-1] < gap:
                    keep_en[-1] = max(keep_en[-1], en[k])
                    keep_n[-1] += 1
                else:
                    keep_s.append(s_[k]); keep_st.append(st[k]); keep_en.append(en[k])  # noqa: E702
                    keep_id.append(ii[k]); keep_n.append(1)  # noqa: E702
            s_, st, en = np.asarray(keep_s, dtype=object), np.asarray(keep_st), np.asarray(keep_en)
            ii, merged = np.asarray(keep_id, dtype=object), np.asarray(keep_n)
        out[ph] = {"site": s_, "base": (st - t0) / 1e9, "dur": np.maximum((en - st) / 1e9, 1e-3),
                   "custom": np.stack([ii, st.astype(str), en.astype(str), merged.astype(str)], axis=-1)}
    return out


def timeline_figure(runs: list[dict[str, Any]]) -> go.Figure:
    """One track per policy on one shared time axis: phases as bars per site, marks on top."""
    n = len(runs)
    fig = make_subplots(rows=n, cols=1, shared_xaxes=True, vertical_spacing=0.06 if n > 1 else 0.1,
                        subplot_titles=[f"{r['policy']} — {r['run_id']}" for r in runs])
    shown: set[str] = set()
    for i, r in enumerate(runs, start=1):
        t0 = r["t0_wall_ns"]
        evid = r["timeline"].get("evidence", "measured")  # a simulated run's timeline is modeled
        rows = list(r["sites"]) + (["cluster"] if any(m["site"] is None for m in r["timeline"]["marks"]) else [])
        for phase, d in _phase_rows(r["timeline"]["phases"], t0, r["end_wall_ns"] - t0).items():
            fig.add_trace(go.Bar(
                orientation="h", y=d["site"], base=d["base"], x=d["dur"], name=phase, legendgroup=phase,
                showlegend=phase not in shown, marker_color=PHASE_COLORS[phase], opacity=0.85,
                customdata=d["custom"],
                hovertemplate=(f"<b>{phase}</b> on %{{y}}<br>event %{{customdata[0]}}<br>"
                               "start_ns %{customdata[1]}<br>end_ns %{customdata[2]}<br>"
                               f"%{{x:.3f}} s ({evid})<extra>" + r["policy"] + "</extra>")), row=i, col=1)
            shown.add(phase)
        for kind, (symbol, color) in MARK_STYLE.items():
            ms = [m for m in r["timeline"]["marks"] if m["kind"] == kind]
            if not ms:
                continue
            fig.add_trace(go.Scatter(
                mode="markers", x=[(m["start_ns"] - t0) / 1e9 for m in ms], y=[m["site"] or "cluster" for m in ms],
                name=kind, legendgroup=f"mark-{kind}", showlegend=f"mark-{kind}" not in shown,
                marker=dict(symbol=symbol, size=13, color=color, line=dict(width=2, color=color)),
                customdata=[[m["event_id"], m["start_ns"], m["end_ns"], m["label"]] for m in ms],
                hovertemplate=(f"<b>{kind}</b>: %{{customdata[3]}}<br>event %{{customdata[0]}}<br>"
                               "start_ns %{customdata[1]}<br>end_ns %{customdata[2]}<br>" + f"t = %{{x:.3f}} s ({evid})"
                               "<extra>" + r["policy"] + "</extra>")), row=i, col=1)
            shown.add(f"mark-{kind}")
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(rows)), row=i, col=1)
    fig.update_layout(barmode="overlay", height=max(260, 170 * n + 80), margin=dict(l=60, r=20, t=40, b=40),
                      legend=dict(orientation="h", y=-0.08 if n > 1 else -0.25), hovermode="closest",
                      template="plotly_white")
    fig.update_xaxes(title_text="seconds since run start (measured, wall clock)", row=n, col=1)
    return fig


def work_figure(runs: list[dict[str, Any]]) -> go.Figure:
    """attempted = retained + lost per policy (stacked), with replayed work beside it."""
    pol = [r["policy"] for r in runs]
    m = [r["metrics"] for r in runs]
    fig = go.Figure()
    fig.add_trace(go.Bar(name="retained", x=pol, y=[x["retained_tokens"]["value"] for x in m], marker_color="#54A24B",
                         hovertemplate="%{x}: retained %{y:,} tokens (measured)<extra></extra>"))
    fig.add_trace(go.Bar(name="lost", x=pol, y=[x["lost_tokens"]["value"] for x in m], marker_color="#E45756",
                         hovertemplate="%{x}: lost %{y:,} tokens (measured)<extra></extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", height=340, margin=dict(l=60, r=20, t=40, b=40),
                      title="Attempted tokens = retained + lost (measured)", yaxis_title="tokens")
    return fig


def bytes_figure(runs: list[dict[str, Any]]) -> go.Figure:
    """The six traffic classes per policy; log scale, since collective bytes dwarf control bytes."""
    classes = list(CLASS_COLORS)
    fig = go.Figure()
    for i, r in enumerate(runs):
        by = r["bytes"]["by_class"]
        fig.add_trace(go.Bar(name=r["policy"], x=classes, y=[max(by.get(c, 0), 0) for c in classes],
                             marker_color=_color(r["policy"], i),
                             hovertemplate="%{x}: %{y:,} B (measured)<extra>" + r["policy"] + "</extra>"))
    fig.update_layout(barmode="group", template="plotly_white", height=360, margin=dict(l=60, r=20, t=40, b=40),
                      title="Inter-site bytes by traffic class (measured, log scale)", yaxis_type="log",
                      yaxis_title="bytes")
    return fig


def frontier_figure(runs: list[dict[str, Any]]) -> go.Figure:
    """The durable frontier (useful tokens safely in the store) over time; every policy ends at the same one."""
    fig = go.Figure()
    for i, r in enumerate(runs):
        t0 = r["t0_wall_ns"]
        pts = r["frontier_progress"]
        fig.add_trace(go.Scatter(
            name=r["policy"], mode="lines+markers", line_shape="hv", line_color=_color(r["policy"], i),
            x=[0.0] + [(p["wall_ns"] - t0) / 1e9 for p in pts], y=[0] + [p["useful_tokens"] for p in pts],
            customdata=[["", ""]] + [[p["event_id"], (p["manifest_hash"] or "")[:12]] for p in pts],
            hovertemplate="t=%{x:.2f} s: %{y:,} useful tokens durable (measured)<br>event %{customdata[0]} "
                          "manifest %{customdata[1]}<extra>" + r["policy"] + "</extra>"))
    fig.update_layout(template="plotly_white", height=340, margin=dict(l=60, r=20, t=40, b=40),
                      title="Durable frontier over time (measured)", xaxis_title="seconds since run start",
                      yaxis_title="useful tokens in the durable frontier")
    return fig


def _reference_trace(fig: go.Figure, reference: dict[str, Any] | None) -> None:
    """One process on the same samples, no WAN (xdc/reference.py), over its own clock."""
    if not reference or reference.get("evidence") != "measured":
        return
    c = reference["curve"]
    fig.add_trace(go.Scatter(
        name="one process (reference)", mode="lines+markers", line=dict(color="#222222", dash="dash"),
        x=[p["t_s"] for p in c], y=[p["heldout_nll"] for p in c], customdata=[[p["useful_tokens_trained"]] for p in c],
        hovertemplate="t=%{x:.2f} s: NLL %{y:.4f} nats/token (measured)<br>%{customdata[0]:,} useful tokens "
                      "trained, one process, no WAN<extra>reference</extra>"))


BASELINE_STYLE = {"unigram": ("#8C8C8C", "dot"), "bigram": ("#5A5A5A", "dash")}  # others: ("#2F2F2F", "dashdot")


def baseline_lines(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """The count baselines of the runs' evaluation set as horizontal lines {"name", "y", "color", "dash",
    "hover"}, once per (eval set, model); or ([], why none can be drawn)."""
    lines: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    sets = {r["learning"].get("baselines", {}).get("eval_set") for r in runs}
    for r in runs:
        b = r["learning"].get("baselines") or {"evidence": "unavailable", "reason": "not in the artifact (older)"}
        if b["evidence"] != "measured":
            return [], b.get("reason", "unavailable")
        for name, m in b["models"].items():
            if (b["eval_set"], name) in seen:
                continue
            seen.add((b["eval_set"], name))
            label = f"{name} baseline" + (f" (eval set {b['eval_set'][:8]})" if len(sets) > 1 else "")
            color, dash = BASELINE_STYLE.get(name, ("#2F2F2F", "dashdot"))
            lines.append({"name": label, "y": m["value"], "color": color, "dash": dash,
                          "hover": f"{label}: %{{y:.4f}} nats/token ± {m.get('se') or 0:.4f} (measured; "
                                   f"{m.get('model')}, fitted on the training split)"})
    return lines, None


def learning_figure(runs: list[dict[str, Any]], references: list[dict[str, Any]] | None = None,
                    curves: list[dict[str, Any]] | None = None,
                    reference: dict[str, Any] | None = None) -> go.Figure:
    """Held-out NLL over the same clock, per policy (error bars: standard error over the eval windows),
    with the count baselines of the same evaluation set as labelled horizontal lines.

    More references join through the arguments: `references`, horizontal lines like baseline_lines'
    ({"name", "y", "color", "dash", "hover"}); `curves`, extra series ({"name", "x", "y", "color",
    "hover"}; x in seconds since run start), e.g. a noise band's edges; `reference`, the single-process run (xdc/reference.py), drawn dashed.
    """
    fig = go.Figure()
    x_max = 1.0
    _reference_trace(fig, reference)
    if reference and reference.get("evidence") == "measured":
        x_max = max([x_max] + [p["t_s"] for p in reference["curve"]])
    for i, r in enumerate(runs):
        c = r["learning"]["curve"]
        se = [p.get("heldout_nll_se") for p in c]
        x_max = max([x_max] + [p["t_s"] for p in c])
        fig.add_trace(go.Scatter(
            name=r["policy"], mode="lines+markers", line_color=_color(r["policy"], i),
            x=[p["t_s"] for p in c], y=[p["heldout_nll"] for p in c],
            error_y=dict(type="data", array=se, visible=True, thickness=1) if c and None not in se else None,
            customdata=[[p["event_id"], p.get("useful_tokens_trained"), p.get("heldout_nll_se")] for p in c],
            hovertemplate="t=%{x:.2f} s: NLL %{y:.4f} ± %{customdata[2]:.4f} nats/token (measured)<br>event "
                          "%{customdata[0]}, %{customdata[1]:,} useful tokens trained<extra>" + r["policy"] + "</extra>"))
    for cv in curves or []:
        fig.add_trace(go.Scatter(name=cv["name"], mode="lines", x=cv["x"], y=cv["y"], line_color=cv.get("color"),
                                 hovertemplate=cv.get("hover", cv["name"] + ": %{y:.4f}") + "<extra></extra>"))
    lines, why_not = baseline_lines(runs)
    for ln in lines + list(references or []):
        fig.add_trace(go.Scatter(name=ln["name"], mode="lines", x=[0.0, x_max], y=[ln["y"], ln["y"]],
                                 line=dict(color=ln.get("color"), dash=ln.get("dash", "dash"), width=1.5),
                                 hovertemplate=ln.get("hover", ln["name"] + ": %{y:.4f}") + "<extra></extra>"))
        fig.add_annotation(x=x_max, y=ln["y"], text=f"{ln['name']} {ln['y']:.3f}", xanchor="right",
                           yanchor="bottom", showarrow=False, font=dict(size=11, color=ln.get("color")))
    if why_not is not None:
        fig.add_annotation(xref="paper", yref="paper", x=0.99, y=0.98, xanchor="right", showarrow=False,
                           text=f"baselines unavailable: {why_not}"[:140], font=dict(size=11, color="#666"))
    fig.update_layout(template="plotly_white", height=380, margin=dict(l=60, r=20, t=40, b=40),
                      title="Held-out NLL over wall time, with count baselines on the same windows (measured)",
                      xaxis_title="seconds since run start", yaxis_title="held-out NLL (nats/token)")
    return fig
