"""Raw event traces on demand: each run's log lines written verbatim to `report/traces/<run>.js`,
and the page's JavaScript that loads one with a <script> tag (works from file://) and shows it
as a filterable table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from analysis.load import RunHistory
from analysis.report_cells import run_key

MAX_TRACE_EVENTS = 200_000  # per run; beyond this the trace file says it is truncated

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


def write_traces(histories: list[RunHistory], art: dict[str, Any], out_dir: Path) -> None:
    """Each run's raw log lines, verbatim, wrapped in one JS call (loaded by a <script> tag on demand).

    The lines are copied as bytes, not re-encoded: they already are JSON objects. The page sorts
    them by wall clock when it loads them.
    """
    (out_dir / "traces").mkdir(parents=True, exist_ok=True)
    keys = {r["run_id"]: run_key(r) for r in art["runs"]}
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
