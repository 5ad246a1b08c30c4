"""Meter validity, measured before any effect is read: pure functions over a trace's series.

- Logger calibration: the achieved poll rate and the jitter of the intervals between polls.
- Each sensor's *effective update period*: how often its value actually changed, versus how often it
  was asked (a 1 s-averaged power reading polled every 20 ms repeats itself ~50 times).
- Counter updates per phase: how many times the cumulative counter changed inside a phase's spans.

Invalidators (thresholds from the frozen `EnergyInvalidators` config) each guard named claims; one
that fires withdraws every claim it guards. A claim on a meter that could not be read is
`unavailable`; a `modeled` number is never a claim and can never pass an energy gate.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

from ground.config import EnergyInvalidators

POWER_QUANTITIES = ("gpu_power", "gpu_power_instant")
ENERGY_COUNTERS = ("gpu_energy", "cpu_energy")  # measured cumulative meters, in preference order


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def poll_calibration(mono_ns: Sequence[int], period_ms: float) -> dict[str, Any]:
    """Achieved rate and interval statistics of the polls (ms); `late_polls` = intervals over 1.5 periods."""
    n = len(mono_ns)
    if n < 2:
        return {"points": n, "period_ms": period_ms, "achieved_rate_hz": None, "target_rate_hz": 1000 / period_ms,
                "interval_median_ms": None, "interval_p95_ms": None, "interval_max_ms": None, "jitter_ms": None,
                "late_polls": 0, "duration_s": 0.0}
    iv = [(b - a) / 1e6 for a, b in zip(mono_ns, mono_ns[1:])]
    dur = (mono_ns[-1] - mono_ns[0]) / 1e9
    return {"points": n, "period_ms": period_ms, "duration_s": dur,
            "achieved_rate_hz": (n - 1) / dur if dur > 0 else None, "target_rate_hz": 1000 / period_ms,
            "interval_median_ms": statistics.median(iv), "interval_p95_ms": _pct(iv, 0.95),
            "interval_max_ms": max(iv), "jitter_ms": statistics.pstdev(iv),
            "late_polls": sum(1 for x in iv if x > 1.5 * period_ms)}


def change_times(series: Iterable[tuple[int, int, float | None, str]]) -> list[int]:
    """Wall ns of every poll whose value differs from the previous readable value (the first readable
    poll is not a change: nothing is known before it)."""
    out, prev = [], None
    for wall, _mono, v, status in series:
        if v is None or not status.startswith("ok"):
            continue
        if prev is not None and v != prev:
            out.append(wall)
        prev = v
    return out


def effective_update(series: Sequence[tuple[int, int, float | None, str]]) -> dict[str, Any]:
    """Polls, readable polls, value changes, and the effective update period in ms: the mean interval
    between the first and the last change. With fewer than two changes it is unknown, and only a lower
    bound (the readable span) is given."""
    ok = [s for s in series if s[2] is not None and s[3].startswith("ok")]
    ch = change_times(series)
    span_ms = (ok[-1][0] - ok[0][0]) / 1e6 if len(ok) > 1 else 0.0
    eff = (ch[-1] - ch[0]) / 1e6 / (len(ch) - 1) if len(ch) >= 2 else None
    last_ok = ok[-1][0] if ok else None
    gone = next((s for s in series if ok and s[0] > last_ok), None) if ok else None
    return {"polls": len(series), "readable_polls": len(ok), "changes": len(ch), "effective_update_period_ms": eff,
            "at_least_ms": None if eff is not None else span_ms,
            "polls_per_update": (len(ok) / len(ch)) if ch else None,
            "last_readable_wall_ns": last_ok,
            "lost_after_wall_ns": gone[0] if gone else None, "lost_status": gone[3] if gone else None}


def updates_in(changes: Sequence[int], spans: Iterable[tuple[int, int]]) -> int:
    """Counter changes whose poll time falls in any of `spans` ([start, end) wall ns; disjoint)."""
    return sum(bisect.bisect_left(changes, b) - bisect.bisect_left(changes, a) for a, b in spans)


@dataclass(frozen=True)
class InvalidatorResult:
    id: str
    rule: str
    sensor: str | None
    threshold: float
    observed: float | None
    fired: bool
    guards: tuple[str, ...]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["guards"] = list(self.guards)
        return d


def evaluate(cal: dict[str, Any], sensors: dict[str, dict[str, Any]], eff: dict[str, dict[str, Any]],
             phase_updates: dict[str, int], cfg: EnergyInvalidators, period_ms: float,
             primary: str | None) -> list[InvalidatorResult]:
    """Every frozen invalidator on this trace. `sensors`: header rows by id; `eff`: effective_update per id;
    `phase_updates`: the primary counter's updates per phase; `primary`: the meter the claims rest on."""
    out: list[InvalidatorResult] = []
    all_claims = ("run_energy", "phase_energy", "power_integrated_energy")
    p95 = cal.get("interval_p95_ms")
    lim = cfg.poll_max_p95_factor * period_ms
    out.append(InvalidatorResult("logger_calibration", f"95th-percentile poll interval > {cfg.poll_max_p95_factor:g} x "
                                 f"poll period ({lim:g} ms)", None, lim, p95, p95 is None or p95 > lim, all_claims,
                                 f"achieved {cal.get('achieved_rate_hz') or 0:.1f} Hz of {cal['target_rate_hz']:.1f} Hz"))
    for sid, row in sorted(sensors.items()):
        e = eff.get(sid) or {}
        if row.get("quantity") in POWER_QUANTITIES and e.get("readable_polls"):
            lim = cfg.gauge_max_update_factor * period_ms
            obs = e.get("effective_update_period_ms")
            fired = (obs if obs is not None else e.get("at_least_ms") or 0.0) > lim
            out.append(InvalidatorResult(f"gauge_effective_update:{sid}", f"effective update period > "
                                         f"{cfg.gauge_max_update_factor:g} x poll period ({lim:g} ms)", sid, lim, obs,
                                         fired, ("power_integrated_energy",),
                                         "" if obs is not None else f"fewer than 2 changes in {e.get('at_least_ms')} ms"))
    if primary is not None:
        e = eff.get(primary) or {}
        obs = e.get("effective_update_period_ms")
        lim = cfg.counter_max_update_ms
        fired = (obs if obs is not None else e.get("at_least_ms") or 0.0) > lim
        out.append(InvalidatorResult(f"counter_effective_update:{primary}", f"counter effective update period > {lim:g} ms",
                                     primary, lim, obs, fired, ("run_energy", "phase_energy")))
        for phase, n in sorted(phase_updates.items()):
            out.append(InvalidatorResult(f"counter_updates:{phase}", f"fewer than {cfg.counter_min_updates_per_phase} "
                                         f"counter updates in phase {phase}", primary,
                                         cfg.counter_min_updates_per_phase, n,
                                         n < cfg.counter_min_updates_per_phase, (f"phase_energy:{phase}",)))
    return out


def claim_status(claim: str, results: Sequence[InvalidatorResult], meter_unavailable: str | None) -> dict[str, Any]:
    """stands / withdrawn (naming the invalidators that fired) / unavailable (why the meter could not be read).

    An invalidator guarding `phase_energy` guards every `phase_energy:<phase>` claim too."""
    if meter_unavailable is not None:
        return {"claim": claim, "status": "unavailable", "reason": meter_unavailable, "fired": []}
    family = claim.split(":", 1)[0]
    fired = [r.id for r in results if r.fired and (claim in r.guards or family in r.guards)]
    return {"claim": claim, "status": "withdrawn" if fired else "stands", "fired": fired,
            "reason": ("withdrawn by " + ", ".join(fired)) if fired else "no invalidator fired"}


def energy_gate(quantity: dict[str, Any], claim: dict[str, Any] | None) -> str:
    """A gate on an energy number can be evaluated only on a `measured` number whose claim stands;
    otherwise it is `unknown` (a modeled number never passes an energy gate)."""
    if quantity.get("evidence") != "measured" or quantity.get("value") is None:
        return "unknown"
    if claim is None or claim.get("status") != "stands":
        return "unknown"
    return "evaluable"
