"""Per-run metrics of a study, each with its evidence class, from a run's summary.json and logs.

Evidence classes: `measured` (read from the run's own logs or counters), `modeled` (computed from
a stated formula over measured counts), `logical` (a count of logged events; no clock involved),
`unavailable` (with the reason).

Opportunity ticks (the logical clock of schedule time)
------------------------------------------------------
A tick is one scheduling opportunity of the cluster: a slot in which it can do one thing on its
critical path. Three kinds are counted from the logs, each once for the whole cluster:
  - one tick per inner optimizer step slot the cluster attempted: distinct (epoch, round,
    inner_step) over every site's `work_attempted` events (the sites of one slot run in parallel);
  - one tick per synchronisation the cluster attempted: distinct (epoch, round) among those
    (sync mode: one per step; local mode: one per H steps);
  - one tick per membership epoch the coordinator opened after the first (`membership_epoch`):
    a failure, restore, rejoin or drain consumes an opportunity.
Work that was lost and redone counts again (its slots were attempted twice). Waiting inside an
opportunity (a slow link, a heartbeat timeout, a loaded CPU) does not count, so the clock does not
depend on machine noise; wall seconds are reported beside it, measured, for what they are.

FLOPs: attempted FLOPs are modeled as 6 x parameters x attempted tokens (forward + backward of a
dense decoder; labelled modeled). Progress per FLOP = (ln(vocab) - final held-out NLL) / attempted
FLOPs: the held-out NLL reduction from a uniform byte predictor (the NLL of an untrained model,
modeled) per attempted FLOP, in nats per FLOP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from analysis.clock import to_steady_axis
from ground.eventlog import process_events as _events

ENERGY_HOOK: Callable[[Path, dict[str, Any]], dict[str, Any]] | None = None  # set by the energy meter


def steady_logs(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every log of the run, its wall stamps on the run's steady axis (analysis/clock.py), the axis
    the run's summary (its learning curve's `wall_ns`) is on."""
    logs = {p.stem: _events(run_dir, p.stem) for p in sorted((Path(run_dir) / "logs").glob("*.jsonl"))}
    to_steady_axis(logs)
    return logs


def opportunity_ticks(run_dir: Path, sites: list[str]) -> dict[str, Any]:
    """The run's tick count, and `at_wall_ns`: the time each tick was first seen (sorted, on the run's
    steady axis), so a curve point can be placed on the tick axis (ticks seen by then)."""
    steps: dict[tuple[int, int, int], int] = {}
    rounds: dict[tuple[int, int], int] = {}
    logs = steady_logs(run_dir)
    for s in sites:
        for e in logs.get(s, []):
            if e.get("event") == "work_attempted":
                t = int(e["wall_ns"])
                k = (int(e["epoch"]), int(e["round"]), int(e.get("inner_step", 0)))
                steps[k] = min(steps.get(k, t), t)
                r = (k[0], k[1])
                rounds[r] = min(rounds.get(r, t), t)
    epochs = [e for e in logs.get("coord", []) if e.get("event") == "membership_epoch"]
    reconf = [int(e["wall_ns"]) for e in epochs[1:]]
    at = sorted([*steps.values(), *rounds.values(), *reconf])
    return {"value": len(at), "unit": "ticks", "evidence": "logical",
            "step_slots": len(steps), "sync_slots": len(rounds), "membership_changes": len(reconf),
            "at_wall_ns": at}


def ticks_at(at_wall_ns: list[int], wall_ns: int) -> int:
    """Ticks seen by wall_ns (a curve point's place on the tick axis)."""
    import bisect

    return bisect.bisect_right(at_wall_ns, int(wall_ns))


def wall_seconds(run_dir: Path) -> dict[str, Any]:
    ev = _events(run_dir, "launcher")
    start = next((e for e in ev if e.get("event") == "run_started"), None)
    end = next((e for e in ev if e.get("event") == "run_finished"), None)
    if start is None or end is None:
        return {"value": None, "unit": "s", "evidence": "unavailable", "reason": "no run_started/run_finished"}
    return {"value": (int(end["mono_ns"]) - int(start["mono_ns"])) / 1e9, "unit": "s", "evidence": "measured",
            "note": "wall clock of the launcher on a shared machine: not a speed measurement"}


_ENERGY_CACHE: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}


def _energy(run_dir: Path, summary: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(energy metrics, compact energy record) of a run (studies/energy.py), computed once per run."""
    from studies.energy import energy_metrics

    key = str(Path(run_dir).resolve())
    if key not in _ENERGY_CACHE:
        _ENERGY_CACHE[key] = energy_metrics(Path(run_dir), summary)
    return _ENERGY_CACHE[key]


def energy(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Device energy of the run: the hook when installed (tests), else the sampler's trace through the
    validity rules (measured only when the run's energy claim stands; else unavailable with the reason)."""
    if ENERGY_HOOK is not None:
        return ENERGY_HOOK(run_dir, summary)
    return _energy(run_dir, summary)[0]["energy_j"]


def run_metrics(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """Every metric a protocol can name, for one finished run."""
    cfg = summary.get("config") or json.loads((run_dir / "config.json").read_text())
    sites = list(cfg["cluster"]["sites"])
    vocab = int(cfg["model"]["vocab_size"])
    n_params = summary.get("n_params")
    attempted = int(summary.get("attempted_tokens") or 0)
    final = summary.get("final_heldout_nll")
    m: dict[str, Any] = {}
    m["final_heldout_nll"] = {"value": final, "unit": "nats/token",
                              "evidence": "measured" if final is not None else "unavailable"}
    if n_params:
        flops = 6.0 * float(n_params) * attempted
        m["attempted_flops"] = {"value": flops, "unit": "FLOP", "evidence": "modeled",
                                "formula": f"6 x {n_params:,} parameters x {attempted:,} attempted tokens"}
    else:
        flops = None
        m["attempted_flops"] = {"value": None, "unit": "FLOP", "evidence": "unavailable",
                                "reason": "the run logged no parameter count"}
    if final is not None and flops:
        m["progress_per_flop"] = {"value": (math.log(vocab) - float(final)) / flops, "unit": "nats/FLOP",
                                  "evidence": "modeled",
                                  "formula": f"(ln {vocab} - final held-out NLL) / attempted FLOPs"}
    else:
        m["progress_per_flop"] = {"value": None, "unit": "nats/FLOP", "evidence": "unavailable",
                                  "reason": "no final NLL or no FLOP count"}
    m["opportunity_ticks"] = {k: v for k, v in opportunity_ticks(run_dir, sites).items() if k != "at_wall_ns"}
    m["wall_s"] = wall_seconds(run_dir)
    by_class = summary.get("bytes_by_class") or {}
    m["inter_site_bytes"] = {"value": int(sum(by_class.values())), "unit": "B", "evidence": "measured",
                             "by_class": by_class}
    m["replayed_tokens"] = {"value": int(summary.get("replayed_tokens") or 0), "unit": "tokens",
                            "evidence": "measured", "lost_tokens": int(summary.get("lost_tokens") or 0)}
    m["energy_j"] = energy(run_dir, summary)
    for name, q in _energy(run_dir, summary)[0].items():
        if name != "energy_j":
            m[name] = q
    return m


def run_record(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The run-level facts a study keeps beside its metrics (hashes, work, checkpoints, validity)."""
    chaos = summary.get("chaos") or {}
    start = next((e for e in _events(run_dir, "launcher") if e.get("event") == "run_started"), {})
    commits = [e for e in _events(run_dir, "coord") if e.get("event") == "commit"]
    cfg = summary.get("config") or json.loads((run_dir / "config.json").read_text())
    ticks = opportunity_ticks(run_dir, list(cfg["cluster"]["sites"]))
    return {
        "run_dir": str(Path(run_dir).resolve()),
        "run_id": summary.get("run_id"),
        "mode": summary.get("mode"), "policy": summary.get("policy"),
        "useful_tokens": summary.get("useful_tokens"), "target_useful_tokens": summary.get("target_useful_tokens"),
        "attempted_tokens": summary.get("attempted_tokens"), "retained_tokens": summary.get("retained_tokens"),
        "lost_tokens": summary.get("lost_tokens"), "work_balanced": summary.get("work_balanced"),
        "clean_exit": summary.get("clean_exit"), "interrupted": bool(chaos.get("fired")),
        "faults_fired": len(chaos.get("fired", [])), "faults_never_fired": len(chaos.get("never_fired", [])),
        "frontier_hash": summary.get("frontier_hash"),
        "state_hash": commits[-1].get("param_hash") if commits else None,
        "final_heldout_nll": summary.get("final_heldout_nll"),
        "heldout_nll_curve": summary.get("heldout_nll_curve", []),
        "curve_ticks": [ticks_at(ticks["at_wall_ns"], p["wall_ns"]) for p in summary.get("heldout_nll_curve", [])],
        "eval_set": summary.get("eval_set"), "dataset_id": summary.get("dataset_id"),
        "baselines": summary.get("baselines"),
        "checkpoints": len(summary.get("checkpoint_tree") or []),
        "code_revision": start.get("code_revision"),
        "init_state": init_state_of(run_dir, cfg),
        "energy": _energy(run_dir, summary)[1],
    }


def init_state_of(run_dir: Path, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The start state the run was configured with and what each site incarnation logged it loaded
    (site_agent/init_state.py); None when the run started from the seeded weights."""
    t = cfg.get("train") or {}
    want = t.get("init_manifest_sha256") or None
    if not want:
        return None
    loaded = {}
    for s in cfg["cluster"]["sites"]:
        for e in _events(run_dir, s):
            if e.get("event") == "site_started":
                loaded.setdefault(s, []).append((e.get("init_state") or {}).get("manifest_sha256"))
    return {"manifest_sha256": want, "store_dir": t.get("init_store_dir"), "loaded": loaded,
            "all_loaded": bool(loaded) and all(h == want for hs in loaded.values() for h in hs)}
