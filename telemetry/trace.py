"""The raw telemetry trace: one JSON line per poll, written by the sampler, read by the analysis.

Line 1 is the header: `{"kind": "header", "run_id", "poll_period_ms", "sensors": [...]}` with every
sensor's id, quantity, unit, kind, evidence and its support at start (`ok` or the unavailable reason).
Then one point per poll:
  {"kind": "point", "i": n, "wall_ns", "mono_ns", "stage": "baseline_before" | "run" | "baseline_after",
   "v": {sensor_id: [value or null, "ok" | "unavailable:<reason>"]}}
and, if the sampler ended normally, `{"kind": "end", "points": n, "reason"}`. The SHA-256 of the
file's bytes is logged by the sampler (`trace_closed` in telemetry.jsonl) and recomputed by the
reader: a missing end line, a torn last line, or a hash that differs makes the trace `truncated`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRACE_NAME = "telemetry/trace.jsonl"  # under the run's logs/ (a subfolder: not a process event log)


class TraceWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8", buffering=1 << 16)
        self.points = 0

    def header(self, **fields: Any) -> None:
        self._write({"kind": "header", **fields})

    def point(self, i: int, wall_ns: int, mono_ns: int, stage: str, values: dict[str, list[Any]]) -> None:
        self._write({"kind": "point", "i": i, "wall_ns": wall_ns, "mono_ns": mono_ns, "stage": stage, "v": values})
        self.points += 1

    def flush(self) -> None:
        self._f.flush()

    def close(self, reason: str) -> tuple[str, int]:
        """Write the end line, close, and return (sha256 of the file, its size in bytes)."""
        self._write({"kind": "end", "points": self.points, "reason": reason})
        self._f.close()
        data = self.path.read_bytes()
        return hashlib.sha256(data).hexdigest(), len(data)

    def _write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")


@dataclass
class Trace:
    path: Path
    header: dict[str, Any]
    points: list[dict[str, Any]]
    end: dict[str, Any] | None
    sha256: str
    n_bytes: int
    problems: list[str] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return self.end is None or bool(self.problems)

    def sensors(self) -> dict[str, dict[str, Any]]:
        return {s["sensor"]: s for s in self.header.get("sensors", [])}

    def series(self, sensor: str, stage: str | None = None) -> list[tuple[int, int, float | None, str]]:
        """[(wall_ns, mono_ns, value or None, status)] of one sensor, in order."""
        out = []
        for p in self.points:
            if stage is not None and p.get("stage") != stage:
                continue
            v = p.get("v", {}).get(sensor)
            if v is None:
                out.append((p["wall_ns"], p["mono_ns"], None, "unavailable:absent_from_point"))
            else:
                out.append((p["wall_ns"], p["mono_ns"], v[0], v[1]))
        return out


def read_trace(path: str | Path) -> Trace | None:
    """The trace at `path`, tolerating a torn or missing tail (each problem is listed); None if absent."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return None
    header: dict[str, Any] = {}
    points: list[dict[str, Any]] = []
    end = None
    problems: list[str] = []
    lines = data.split(b"\n")
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            last = all(not x.strip() for x in lines[n:])
            problems.append(f"line {n}: {'torn last line' if last else 'unreadable line'}")
            continue
        kind = obj.get("kind") if isinstance(obj, dict) else None
        if kind == "header":
            header = obj
        elif kind == "point":
            points.append(obj)
        elif kind == "end":
            end = obj
        else:
            problems.append(f"line {n}: not a trace record")
    if not header:
        problems.append("no header line")
    if end is None:
        problems.append(f"no end line: the sampler stopped without closing the trace (after {len(points)} points)")
    elif end.get("points") != len(points):
        problems.append(f"end line says {end.get('points')} points, {len(points)} read")
    return Trace(p, header, points, end, hashlib.sha256(data).hexdigest(), len(data), problems)
