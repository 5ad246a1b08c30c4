"""The published page's HTML pieces: escaping, numbers with their evidence class and units, tables,
state badges, the raw-trace box and the provenance block. Shared by every section (xdc/page_*.py)."""

from __future__ import annotations

import math
from html import escape
from typing import Any



# ---- small helpers ------------------------------------------------------------------------------

def e(v: Any) -> str:
    return escape("" if v is None else str(v))


def ev(evidence: str | None) -> str:
    evidence = evidence or "unavailable"
    return f"<span class='ev ev-{e(evidence)}'>{e(evidence)}</span>"


def fmt(v: Any, spec: str = ",") -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "—"
    if isinstance(v, (int, float)):
        return format(v, spec)
    return e(v)


def qty(q: dict[str, Any] | None, spec: str = ",", unit: bool = True) -> str:
    """A cell with a quantity and the evidence class its artifact gives it."""
    q = q or {}
    v = q.get("value")
    evidence = q.get("evidence", "unavailable") if v is not None else "unavailable"
    u = f" {e(q.get('unit'))}" if unit and v is not None and q.get("unit") else ""
    return f"<td class='num'>{fmt(v, spec)}{u}{ev(evidence)}</td>"


def cell(v: Any, evidence: str | None, spec: str = ",", unit: str = "") -> str:
    if v is None:
        return f"<td class='num'>—{ev('unavailable')}</td>"
    return f"<td class='num'>{fmt(v, spec)}{(' ' + e(unit)) if unit else ''}{ev(evidence)}</td>"


def table(caption: str, head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """An accessible table: a caption, column headers with scope, cells given as HTML (a string that
    does not start with <td is wrapped in one)."""
    hs = "".join(f"<th scope='col'>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<table class='{e(cls)}'><caption>{caption}</caption><thead><tr>{hs}</tr></thead>"
            f"<tbody>{body}</tbody></table>")


def state_badge(state: str) -> str:
    return f"<span class='state state-{e(state)}'>{e(state)}</span>"


def trace_box(res: dict[str, Any], key: str, label: str) -> str:
    rel = f"../{res['name']}/traces/{key}.js"
    return (f"<div class='trace' id='trace-{e(key)}'><button type='button' data-src='{e(rel)}' "
            f"onclick='xdcLoadTrace(this)'>Load the raw trace of {e(label)}</button> <span class='trace-status'>"
            "not loaded yet</span>" + table(f"Raw trace: {e(label)}", ["Event id", "Event", "Epoch", "Round",
                                                                       "Useful tokens", "Held-out NLL", "Reason / kind",
                                                                       "Wall ns"], []) + "</div>")


def provenance_block(res: dict[str, Any]) -> str:
    p = res.get("provenance") or {}
    rt = p.get("runtime") or {}
    proto = p.get("protocol")
    items = [f"code commit <span class='mono'>{e(p.get('code_commit'))}</span> (clean tree: "
             f"{'yes' if p.get('clean_tree') else 'no'})",
             f"dataset <span class='mono'>{e(p.get('dataset_id'))}</span>",
             f"runtime: Python {e(rt.get('python'))}, torch {e(rt.get('torch'))}, device {e(rt.get('device'))}"]
    if p.get("simulator_commit"):
        items.append(f"simulator commit <span class='mono'>{e(p['simulator_commit'])}</span>")
    if proto:
        items.append(f"protocol {e(proto['name'])} version {e(proto['version'])}, SHA-256 <span class='mono'>"
                     f"{e(proto['sha256'])}</span>, registered {e(proto.get('registered_utc'))} at "
                     f"<span class='mono'>{e(proto.get('registration_commit'))}</span>"
                     + ("" if proto.get("registration_clean") else
                        " <b>from a dirty tree</b>: that the protocol was frozen before the runs is not provable"))
    items.append(f"source artifact SHA-256 <span class='mono'>{e(res.get('source_artifact_sha256'))}</span>")
    traces = res.get("raw_traces") or []
    rows = [[f"<td class='mono'>{e(t['file'])}</td>", cell(t["bytes"], "measured", ","),
             f"<td class='mono'>{e(t['sha256'])}</td>"] for t in traces]
    files = [[f"<td class='mono'>results/{e(res['name'])}/{e(k)}</td>", f"<td class='mono'>{e(v)}</td>"]
             for k, v in sorted((res.get("files") or {}).items())]
    return ("<details class='provenance'><summary>Hashes and complete provenance</summary><ul>"
            + "".join(f"<li>{i}</li>" for i in items) + "</ul>"
            + f"<p>Regenerate: <code>{e(res.get('regenerate') or 'not recorded')}</code>. "
            + e(res.get("raw_traces_note", "")) + "</p>"
            + (table(f"{len(traces)} raw logs this result was computed from", ["Log", "Bytes", "SHA-256"], rows)
               if rows else "")
            + (table("Published files", ["File", "SHA-256"], files) if files else "") + "</details>")
