"""A study run's energy metrics and its compact energy record, from the run's telemetry and logs
(analysis/energy.py: validity first, then phase attribution).

Metrics (each with its evidence class):
  energy_j             measured device energy of the run stage, only when the run's `run_energy` claim
                       stands (no frozen invalidator fired); else `unavailable`, with the reason, and the
                       raw number (if any) kept as `diagnostic_value`, never as `value`.
  energy_checkpoint_j  energy inside the machine timeline's `checkpoint` phase (the snapshot group), under
  energy_replay_j      its `phase_energy:<phase>` claim; `replay` = compute that redid lost samples plus
                       recovery and state transfer (the replay group: what continuing would have avoided).
                       A phase the run never entered is 0 J, measured, when the meter stands.
The record keeps what the study page shows per run: the trace's SHA-256, polls and counter updates, the
effective update period, every invalidator that fired, the claims, the modeled (CPU) energy, and the
phase table (duration, energy, modeled energy, counter updates, effective update equivalents).
A `modeled` number is shown, labelled, and never passes an energy gate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The phase groups of the attribution contrasts: snapshots versus redoing lost work.
PHASE_GROUPS = {"energy_checkpoint_j": ("checkpoint",), "energy_replay_j": ("replay", "recovery", "state_transfer")}


def _unavailable(reason: str, diagnostic: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"value": None, "unit": "J", "evidence": "unavailable", "reason": reason}
    if diagnostic is not None:
        out["diagnostic_value"] = diagnostic
    return out


def _claim(sec: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in sec.get("claims", []) if c["claim"] == name),
                {"claim": name, "status": "unavailable", "reason": sec.get("reason") or "no claim"})


def group_energy(sec: dict[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
    """Measured energy of a phase group: the sum of its phases, each under its own claim."""
    m = sec["run_energy"]["measured"]
    if m.get("evidence") == "unavailable":  # no meter (or no sampler): nothing was measured
        return _unavailable(m.get("reason") or sec.get("reason") or "no measured energy")
    rows = [p for p in sec.get("phases", []) if p["phase"] in phases]
    raw = [p["energy"]["value"] for p in rows]
    diag = sum(float(v) for v in raw if v is not None) if rows else None
    why = []
    for p in rows:
        c = _claim(sec, f"phase_energy:{p['phase']}")
        if c["status"] != "stands":
            why.append(f"{p['phase']}: {c['reason']}")
        elif p["energy"]["value"] is None:
            why.append(f"{p['phase']}: {p['energy'].get('reason', 'no value')}")
    if why:
        return _unavailable("; ".join(why), diag)
    # a phase the run never entered holds 0 J
    return {"value": diag or 0.0, "unit": "J", "evidence": "measured", "phases": list(phases)}


def run_energy(sec: dict[str, Any]) -> dict[str, Any]:
    m = sec["run_energy"]["measured"]
    c = _claim(sec, "run_energy")
    if m.get("evidence") == "measured" and m.get("value") is not None:
        if c["status"] == "stands":
            return {"value": float(m["value"]), "unit": "J", "evidence": "measured", "claim": "stands"}
        return _unavailable(f"claim withdrawn: {c['reason']}", float(m["value"]))
    return _unavailable(m.get("reason") or sec.get("reason") or "no measured energy")


def compact_record(sec: dict[str, Any]) -> dict[str, Any]:
    """What the study page shows per run (analysis/energy.py's section, without the per-sensor detail)."""
    tr = sec.get("trace") or {}
    val = sec.get("validity") or {}
    primary = [m for m in sec.get("meters", []) if m["quantity"] in ("gpu_energy", "cpu_energy") and m["support"] == "ok"]
    phases = [{"phase": p["phase"], "duration_s": p["duration"]["value"], "energy_j": p["energy"]["value"],
               "energy_evidence": p["energy"]["evidence"], "energy_modeled_j": p["energy_modeled"]["value"],
               "idle_subtracted_j": p["idle_subtracted"]["value"], "counter_updates": p.get("counter_updates"),
               "modeled_updates": p.get("modeled_updates"),
               "effective_update_equivalents": p.get("effective_update_equivalents"), "claim": p["claim"]}
              for p in sec.get("phases", [])]
    return {
        "evidence": sec.get("evidence"), "reason": sec.get("reason"),
        "sampler_ran": bool((sec.get("sampler") or {}).get("ran")),
        "trace_sha256": tr.get("sha256"), "trace_whole": bool(tr.get("hash_matches")) and not tr.get("truncated"),
        "polls": (val.get("poll") or {}).get("points"), "poll": val.get("poll"),
        "meter": primary[0]["sensor"] if primary else None,
        "counter_updates": primary[0]["changes"] if primary else None,
        "effective_update_period_ms": primary[0]["effective_update_period_ms"] if primary else None,
        "invalidators_fired": [i["id"] for i in val.get("invalidators", []) if i["fired"]],
        "thresholds": val.get("thresholds"),
        "claims": [{k: c[k] for k in ("claim", "status", "reason")} for c in sec.get("claims", [])],
        "run_modeled_j": (sec.get("run_energy", {}).get("modeled") or {}).get("value"),
        "run_idle_subtracted_j": (sec.get("run_energy", {}).get("idle_subtracted") or {}).get("value"),
        "phases": phases,
    }


def energy_metrics(run_dir: Path, summary: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """({energy metric: quantity}, compact record) of one finished run."""
    from analysis.energy import energy_section
    from analysis.load import load_run

    try:
        sec = energy_section(load_run(Path(run_dir)), int(summary.get("useful_tokens") or 0))
    except Exception as e:  # a broken trace must not lose the run's other metrics
        why = f"energy analysis failed: {type(e).__name__}: {e}"
        return {m: _unavailable(why) for m in ("energy_j", *PHASE_GROUPS)}, {"evidence": "unavailable", "reason": why,
                                                                              "phases": [], "claims": []}
    metrics = {"energy_j": run_energy(sec), **{m: group_energy(sec, ph) for m, ph in PHASE_GROUPS.items()}}
    return metrics, compact_record(sec)
