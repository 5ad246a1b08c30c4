"""`xdc sql`: the runs' JSON-lines logs as a DuckDB table, for questions nobody wrote a chart for.

Views (one row per event):
  events   id, event, process, run (the run directory's name), wall_ns, mono_ns, epoch, step,
           pid, and `data` (the whole event as JSON: `data->>'tokens'`, `data->'samples'`)
  commits  the coordinator's commit record: run, id, epoch, round, commit_id, parent, members
  work     every work_attempted: run, process (the site), epoch, round, tokens, flops
  spans    every span event: run, process, event, start_ns, end_ns (wall, as logged), seconds (monotonic)
  ledger   the optimizer-commit ledger: per commit its setting (mode, H, compression), useful
           tokens, the cycle's disagreement / payload / WAN time, the controller's action and reason

Examples (also in the README):
  SELECT run, process, count(*) FROM work GROUP BY ALL ORDER BY ALL
  SELECT event, count(*) n FROM events GROUP BY event ORDER BY n DESC LIMIT 10
  SELECT run, process, event, round(sum(seconds), 2) s FROM spans GROUP BY ALL ORDER BY s DESC LIMIT 10
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.load import expand_inputs

VIEWS = """
CREATE VIEW events AS
  SELECT json->>'id' AS id, json->>'event' AS event, json->>'process' AS process,
         regexp_extract(filename, '([^/]+)/logs/[^/]+$', 1) AS run,
         CAST(json->>'wall_ns' AS BIGINT) AS wall_ns, CAST(json->>'mono_ns' AS BIGINT) AS mono_ns,
         CAST(json->>'epoch' AS BIGINT) AS epoch, CAST(json->>'step' AS BIGINT) AS step,
         CAST(json->>'pid' AS BIGINT) AS pid, json AS data
  FROM read_ndjson_objects({files}, filename = true, ignore_errors = true);
CREATE VIEW commits AS
  SELECT run, id, epoch, CAST(data->>'round' AS BIGINT) AS round, data->>'commit_id' AS commit_id,
         data->>'parent' AS parent, CAST(data->'members' AS VARCHAR[]) AS members, wall_ns
  FROM events WHERE event = 'commit';
CREATE VIEW work AS
  SELECT run, process, id, epoch, CAST(data->>'round' AS BIGINT) AS round,
         CAST(data->>'tokens' AS BIGINT) AS tokens, CAST(data->>'flops' AS DOUBLE) AS flops, wall_ns
  FROM events WHERE event = 'work_attempted';
CREATE VIEW ledger AS
  SELECT c.run, c.data->>'commit_id' AS commit_id, c.data->>'parent' AS parent, c.epoch,
         CAST(c.data->>'round' AS BIGINT) AS round, c.step, c.wall_ns,
         c.data->'setting'->>'mode' AS mode, CAST(c.data->'setting'->>'inner_steps_h' AS BIGINT) AS inner_steps_h,
         c.data->'setting'->>'compression' AS compression, CAST(c.data->>'useful_tokens' AS BIGINT) AS useful_tokens,
         CAST(o.data->>'cos_to_mean' AS DOUBLE) AS cos_to_mean, CAST(o.data->>'payload_bytes' AS BIGINT) AS payload_bytes,
         CAST(o.data->>'t_comm_s' AS DOUBLE) AS wan_time_s, CAST(o.data->>'goodput_bps' AS DOUBLE) AS goodput_bps,
         d.data->>'action' AS action, d.data->>'reason' AS reason
  FROM events c
  LEFT JOIN events o ON o.event = 'cycle_observed' AND o.run = c.run AND o.process = c.process
       AND o.data->>'round' = c.data->>'round' AND o.data->>'epoch' = CAST(c.epoch AS VARCHAR)
  LEFT JOIN events d ON d.event = 'controller_decision' AND d.run = c.run AND d.process = c.process
       AND d.data->>'round' = c.data->>'round' AND d.data->>'commit_epoch' = CAST(c.epoch AS VARCHAR)
  WHERE c.event = 'commit';
CREATE VIEW spans AS
  SELECT run, process, event, id, CAST(data->>'start_wall_ns' AS BIGINT) AS start_ns,
         CAST(data->>'end_wall_ns' AS BIGINT) AS end_ns,
         COALESCE(CAST(data->>'end_mono_ns' AS BIGINT) - CAST(data->>'start_mono_ns' AS BIGINT),
                  CAST(data->>'end_wall_ns' AS BIGINT) - CAST(data->>'start_wall_ns' AS BIGINT)) / 1e9 AS seconds
  FROM events WHERE data->>'start_wall_ns' IS NOT NULL;
"""


def connect(paths: list[str | Path]) -> Any:
    import duckdb

    runs, _index, _cmp = expand_inputs(paths)
    files = [str(f) for r in runs for f in sorted((r / "logs").glob("*.jsonl"))]
    con = duckdb.connect()
    lst = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"
    con.execute(VIEWS.format(files=lst))
    return con


def query(paths: list[str | Path], sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    con = connect(paths)
    try:
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description] if cur.description else []
        return cols, cur.fetchall()
    finally:
        con.close()


def format_table(cols: list[str], rows: list[tuple[Any, ...]], max_width: int = 60) -> str:
    def cell(v: Any) -> str:
        s = "NULL" if v is None else str(v)
        return s if len(s) <= max_width else s[: max_width - 1] + "…"

    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in body]) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in body]
                     + [f"({len(rows)} row{'s' if len(rows) != 1 else ''})"])
