"""The run's one time axis: the monotonic clock, anchored to the wall clock at the run's first event.

Every event carries `wall_ns` (CLOCK_REALTIME) and `mono_ns` (CLOCK_MONOTONIC); spans also carry
`start_/end_wall_ns` and `start_/end_mono_ns`. Every process of a run shares one host's monotonic
clock (containers share the kernel's), and nothing steps it; the wall clock can step mid-run (NTP:
one emulated run's stepped by 19.6 s, which put its timelines and time to target that far off its
repeat's). So analysis puts every wall-clock stamp on the steady axis `mono + offset`, where
`offset` is wall - mono of the run's earliest event (by mono): before any step, the axis is the
wall clock; after one, it keeps going as if there had been none. The step itself is measured
(`step_ns`: how far wall - mono moved over the run) so the page can say it happened.

Logs without `mono_ns` on every event (hand-made ones, old formats) are left on the wall clock
(`steady` False): mixing the two axes would be worse than either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SPAN_PAIRS = (("start_wall_ns", "start_mono_ns"), ("end_wall_ns", "end_mono_ns"))


@dataclass(frozen=True)
class RunClock:
    steady: bool  # the logs' wall stamps were put on the steady axis
    offset_ns: int | None  # wall - mono at the run's earliest event (None: no event has both)
    step_ns: int  # how far wall - mono moved over the run (0: the wall clock never stepped)


def _has_both(e: dict[str, Any]) -> bool:
    return isinstance(e.get("wall_ns"), int) and isinstance(e.get("mono_ns"), int)


def measure(logs: dict[str, list[dict[str, Any]]]) -> RunClock:
    """The run's clock, from every event that has both stamps (one pass)."""
    first_mono: int | None = None
    offset: int | None = None
    lo = hi = 0
    complete = True
    for evs in logs.values():
        for e in evs:
            if not _has_both(e):
                complete = False
                continue
            if "start_wall_ns" in e or "end_wall_ns" in e:
                complete = complete and all(isinstance(e.get(m), int) for w, m in SPAN_PAIRS if w in e)
            off = e["wall_ns"] - e["mono_ns"]
            if offset is None:
                lo = hi = off
            lo, hi = min(lo, off), max(hi, off)
            if first_mono is None or e["mono_ns"] < first_mono:
                first_mono, offset = e["mono_ns"], off
    if offset is None:
        return RunClock(False, None, 0)
    return RunClock(complete, offset, hi - lo)


def put_on_steady_axis(logs: dict[str, list[dict[str, Any]]], clock: RunClock) -> None:
    """Rewrite the events' wall stamps (in place) as mono + offset, when `clock.steady`."""
    if not clock.steady or clock.offset_ns is None:
        return
    off = clock.offset_ns
    for evs in logs.values():
        for e in evs:
            e["wall_ns"] = e["mono_ns"] + off
            if "start_wall_ns" in e:
                for w, m in SPAN_PAIRS:
                    if w in e:
                        e[w] = e[m] + off


def to_steady_axis(logs: dict[str, list[dict[str, Any]]]) -> RunClock:
    """A run's logs (process -> events) measured and put on the steady axis in place: its clock."""
    clock = measure(logs)
    put_on_steady_axis(logs, clock)
    return clock


def steady_points(points: list[dict[str, Any]], clock: RunClock) -> None:
    """A telemetry trace's points (telemetry/trace.py: wall_ns and mono_ns each) on the same axis."""
    if not clock.steady or clock.offset_ns is None:
        return
    for p in points:
        if isinstance(p.get("mono_ns"), int):
            p["wall_ns"] = p["mono_ns"] + clock.offset_ns
