"""The simulator against held-out emulator runs: the same numbers from both, their errors, the claims.

Held out: the timing model is fitted (sim/calibrate.py) on calibration runs whose scenarios are
not the validated ones; each held-out emulator run is then simulated from its own config.json and
scenario.json, and both run directories are measured by the same functions:

  time_to_target_s   analysis' active_time (first epoch -> the target in the commit record)
  idle_s             analysis' idle_time_all_sites
  lost_tokens        analysis' lost_tokens (attempted, not in the commit record)
  bytes per class    the sites' own logged payloads: collective spans' payload_bytes_sent, state_sent
                     bytes, checkpoint_save bytes_uploaded
  wan_bytes          inter-site bytes per class through the WAN, as the byte ledger counts them from
                     every process's `wan_counters` (the emulator's WanNode counters; the simulator's
                     modeled ones, sim/wan_bytes.py): collective (with its aborted part), state
                     transfer, checkpoint, control. Toxiproxy's own counters are not compared (the
                     simulator has none).
  recovery_s         the first injected fault -> the first commit of an epoch formed after it

Claims (issue 15's goals), each with its falsifier and a status: survived (every held-out run
within the goal), falsified (one is not: named), undecided (the emulator's own repeats of a
scenario disagree by more than the simulator does: see `claims`), or not run (no held-out run
could be simulated).

Timing bounds. Four fitted parameters are set by the host's or the chaos driver's timing, not by
progress (`TIMING_SPREAD`: a cold restart's length, the driver's poll delay, a killed process's
exit and its connection's close), and a run's bytes and lost tokens can step on which side of a
round boundary they land. Each held-out run is therefore also simulated with all of them at their
fitted fewest and at their most (`timing_bounds`); where the simulator at its fitted values misses
the emulator but the emulator lies inside the simulator's own range over that spread, the byte and
lost-token verdicts say undecided (the simulator cannot call the race), never survived.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from analysis.artifact import build_artifact
from chaos.scenario import Scenario
from ground.config import config_from_json
from ground.eventlog import process_events
from sim.model import SimModel
from sim.runs import simulate_run

BYTE_CLASSES = ("collective", "state_transfer", "checkpoint")
WAN_CLASSES = ("collective", "state_transfer", "checkpoint", "control")
GOALS = {"time_to_target_s": 0.10, "bytes": 0.02, "lost_tokens": 0.0}
# Fitted parameters paced by the host or the chaos driver, not by progress (see the module doc).
TIMING_SPREAD = ("restart_s", "fault_poll_s", "crash_teardown_s", "crash_close_s")


def timing_spread(calibration: dict[str, Any]) -> dict[str, list[float]]:
    """Each TIMING_SPREAD parameter's fitted [fewest, most] (those the calibration has a range for)."""
    params = calibration.get("parameters") or {}
    return {k: params[k]["range"] for k in TIMING_SPREAD if k in params and params[k].get("range")}


def timing_bounds(model: SimModel, calibration: dict[str, Any]) -> dict[str, SimModel]:
    """The model with every TIMING_SPREAD parameter at its fitted fewest ("fewest") and at its most
    ("most"); {} when the calibration has no range for any of them."""
    spread = timing_spread(calibration)
    if not spread:
        return {}
    return {"fewest": replace(model, **{k: float(r[0]) for k, r in spread.items()}),
            "most": replace(model, **{k: float(r[1]) for k, r in spread.items()})}


def bounds_of(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulator's range [fewest, most] of lost tokens and of bytes per class over several
    simulations of one run (its fitted values and its timing bounds)."""
    def rng(vals: list[Any]) -> list[Any] | None:
        vals = [v for v in vals if v is not None]
        return [min(vals), max(vals)] if vals else None
    return {"lost_tokens": rng([m["lost_tokens"] for m in measured]),
            "bytes": {c: rng([m["bytes"].get(c) for m in measured]) for c in BYTE_CLASSES},
            "wan_bytes": {c: rng([(m.get("wan_bytes") or {}).get(c) for m in measured]) for c in WAN_CLASSES}}


def _sim_range(rs: list[dict[str, Any]], side: str, c: str | None = None) -> list[Any] | None:
    """The simulator's timing-bounds range of one number in a group's first row (None: not simulated)."""
    b = rs[0].get("simulator_bounds")
    if not b:
        return None
    return b.get(side) if c is None else (b.get(side) or {}).get(c)


def measure(run_dir: Path) -> dict[str, Any]:
    """The validated numbers of one run directory (emulated or simulated: the same code)."""
    art = build_artifact([run_dir])
    r = art["runs"][0]
    m = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in r["metrics"].items()}
    cfg = config_from_json(run_dir / "config.json")
    by_class = dict.fromkeys(BYTE_CLASSES, 0)
    for site in cfg.cluster.sites:
        for e in process_events(run_dir, site):
            ev = e["event"]
            if ev == "collective" and "error" not in e:
                by_class["collective"] += int(e.get("payload_bytes_sent") or 0)
            elif ev == "state_sent":
                by_class["state_transfer"] += int(e.get("bytes") or 0)
            elif ev == "checkpoint_save" and "error" not in e:
                by_class["checkpoint"] += int(e.get("bytes_uploaded") or e.get("bytes") or 0)
    ledger = r["bytes"]["by_class"]
    wan = None  # a run whose processes logged no counters has no WAN bytes to compare (not zero bytes)
    if any(ledger.get(c) for c in WAN_CLASSES):
        wan = {c: int(ledger.get(c, 0)) for c in WAN_CLASSES}
        wan["collective"] += int(ledger.get("aborted_collective", 0))
    return {"policy": r["policy"], "time_to_target_s": m.get("active_time"), "idle_s": m.get("idle_time_all_sites"),
            "lost_tokens": m.get("lost_tokens"), "useful_tokens": m.get("useful_tokens"), "bytes": by_class,
            "wan_bytes": wan, "recovery_s": recovery_s(run_dir)}


def recovery_s(run_dir: Path) -> float | None:
    """First fault_injected -> the first commit of an epoch formed after it (None: no fault, or no such commit)."""
    faults = [e for e in process_events(run_dir, "chaos") if e["event"] == "fault_injected" and not e.get("noop")]
    if not faults:
        return None
    t = faults[0]["mono_ns"]
    epoch_at, after = 0, None
    for e in process_events(run_dir, "coord"):
        if e["event"] == "membership_epoch" and e["mono_ns"] <= t:
            epoch_at = e["epoch"]
        elif e["event"] == "commit" and e["mono_ns"] > t and e["epoch"] > epoch_at:
            after = e["mono_ns"]
            break
    return (after - t) / 1e9 if after is not None else None


def simulate_like(emulated: Path, model: SimModel, out: Path) -> Path:
    """The emulator run's config and scenario, simulated with `model`, into `out`."""
    cfg = config_from_json(emulated / "config.json")
    scen_path = emulated / "scenario.json"
    scenario = Scenario.from_dict(json.loads(scen_path.read_text())) if scen_path.exists() else None
    simulate_run(cfg, scenario, model, out, extra={"emulator_run": str(emulated)})
    return out


def _rel(sim: float | None, emu: float | None) -> float | None:
    if sim is None or emu is None:
        return None
    return abs(sim - emu) / abs(emu) if emu else (0.0 if sim == emu else float("inf"))


def compare(emu: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Per-number errors (relative; lost tokens as the absolute difference)."""
    return {"time_to_target": _rel(sim["time_to_target_s"], emu["time_to_target_s"]),
            "idle": _rel(sim["idle_s"], emu["idle_s"]),
            "lost_tokens_diff": (None if sim["lost_tokens"] is None or emu["lost_tokens"] is None
                                 else sim["lost_tokens"] - emu["lost_tokens"]),
            "bytes": {c: _rel(sim["bytes"][c], emu["bytes"][c]) for c in BYTE_CLASSES},
            "wan_bytes": ({c: _rel(sim["wan_bytes"][c], emu["wan_bytes"][c]) for c in WAN_CLASSES}
                          if sim.get("wan_bytes") and emu.get("wan_bytes") else {}),
            "recovery": _rel(sim["recovery_s"], emu["recovery_s"])}


def ranking(rows: list[dict[str, Any]], side: str) -> list[str]:
    """Policies from the fastest time to target (one comparison's rows)."""
    return [r["policy"] for r in sorted(rows, key=lambda r: (r[side]["time_to_target_s"] or float("inf"),
                                                            r["policy"]))]


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The rows of one (scenario, policy): the emulator's repeats of one simulated run."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["scenario"], r["policy"]), []).append(r)
    return by


def time_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (scenario, policy): the emulator's times to target over its repeats, their mean and spread
    ((max - min) / mean), the simulated time, its error against the emulator's mean, and a verdict:
    "within" the goal of the mean, "inside the emulator's spread" (off the mean by more than the goal
    but between the emulator's own fastest and slowest run: its repeats disagree by more than the
    simulator does, so this cannot decide), or "outside" (a falsifier)."""
    out = []
    for (scen, pol), rs in sorted(_groups(rows).items()):
        ts = [r["emulator"]["time_to_target_s"] for r in rs]
        sims = [r["simulator"]["time_to_target_s"] for r in rs]
        if any(t is None for t in ts) or any(x is None for x in sims):
            out.append({"scenario": scen, "policy": pol, "emulator_s": ts, "verdict": "outside",
                        "why": "a run did not reach the target on one side"})
            continue
        sim = sims[0]  # the simulated runs are one run (deterministic: the same config and scenario)
        verdict, err, spread = judge(ts, sim, GOALS["time_to_target_s"])
        verdict = "inside the emulator's spread" if verdict == "undecided" else verdict
        mean = sum(ts) / len(ts)
        out.append({"scenario": scen, "policy": pol, "emulator_s": ts, "emulator_mean_s": mean,
                    "emulator_spread": spread, "simulator_s": sim, "error_vs_mean": err,
                    "verdict": verdict})
    return out


def judge(emu: list[float], sim: float, goal: float) -> tuple[str, float, float | None]:
    """(verdict, error against the emulator's mean, the repeats' spread (max - min) / mean or None with
    one run): "within" the goal of the mean; "undecided" off it but between the emulator's own
    repeats, which disagree by more than the simulator does; "outside" otherwise (a falsifier)."""
    mean = sum(emu) / len(emu)
    err = abs(sim - mean) / abs(mean) if mean else (0.0 if sim == 0 else float("inf"))
    spread = (max(emu) - min(emu)) / abs(mean) if len(emu) > 1 and mean else None
    if err <= goal:
        return "within", err, spread
    return ("undecided" if len(emu) > 1 and min(emu) <= sim <= max(emu) else "outside"), err, spread


def byte_verdicts(rows: list[dict[str, Any]], side: str, classes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(falsifiers, undecided) of a byte claim (`side`: "bytes" or "wan_bytes") per (scenario, policy,
    class), against the emulator's repeats (`judge`, goal 2 %); one the simulator misses but whose
    emulator mean lies inside the simulator's timing-bounds range (widened by the goal) is undecided."""
    bad, unsure = [], []
    for (scen, pol), rs in sorted(_groups(rows).items()):
        for c in classes:
            emu = [r["emulator"][side].get(c) for r in rs]
            sim = rs[0]["simulator"][side].get(c)
            if sim is None or any(e is None for e in emu):
                continue
            verdict, err, _spread = judge(emu, sim, GOALS["bytes"])
            where = f"{scen}/{pol} {c}: {err:.1%}" + (f" off the emulator's mean of {len(emu)} run(s)" if len(emu) > 1 else "")
            rng, mean = _sim_range(rs, side, c), sum(emu) / len(emu)
            if verdict == "outside" and rng and rng[0] * (1 - GOALS["bytes"]) <= mean <= rng[1] * (1 + GOALS["bytes"]):
                unsure.append(where + f", inside the simulator's own range {rng} over the fitted timing spread")
            elif verdict == "outside":
                bad.append(where + (f", outside their range {sorted(emu)}" if len(emu) > 1 else ""))
            elif verdict == "undecided":
                unsure.append(where + f", inside their range {sorted(emu)}")
    return bad, unsure


def lost_token_verdicts(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(falsifiers, undecided) of the lost-token claim, per (scenario, policy) of progress-triggered
    runs. Where the emulator's repeats lost the same tokens the simulator must too; where they lost
    different amounts (how far the round in flight got before the failure was seen is a matter of
    time, not progress), a simulated count between the emulator's fewest and most is undecided. So is
    a miss where the simulator's own range over the timing bounds reaches the emulator's counts."""
    bad, unsure = [], []
    for (scen, pol), rs in sorted(_groups([r for r in rows if r["progress_triggered"]]).items()):
        emu = [r["emulator"].get("lost_tokens") for r in rs]
        diffs = [r["error"]["lost_tokens_diff"] for r in rs]
        if any(d is None for d in diffs) or any(e is None for e in emu):
            bad.append(f"{scen}/{pol}: lost tokens not measured on one side")
            continue
        sim = emu[0] + diffs[0]
        rng = _sim_range(rs, "lost_tokens")
        # The simulator's range over the timing spread reaches the emulator's repeats: it cannot call it.
        reach = rng is not None and rng[0] <= max(emu) and min(emu) <= rng[1]
        if len(set(emu)) == 1:
            if sim != emu[0] and reach:
                unsure.append(f"{scen}/{pol}: simulated {sim:,}, {emu[0]:,} inside the simulator's own range "
                              f"{rng} over the fitted timing spread")
            elif sim != emu[0]:
                bad.append(f"{scen}/{pol}: {sim - emu[0]:+,}")
        elif min(emu) <= sim <= max(emu):
            unsure.append(f"{scen}/{pol}: simulated {sim:,} between the emulator's repeats {sorted(emu)}")
        elif reach:
            unsure.append(f"{scen}/{pol}: simulated {sim:,} outside the emulator's repeats {sorted(emu)}, which "
                          f"the simulator's own range {rng} over the fitted timing spread reaches")
        else:
            bad.append(f"{scen}/{pol}: simulated {sim:,} outside the emulator's repeats {sorted(emu)}")
    return bad, unsure


def _mean_ranking(rows: list[dict[str, Any]]) -> list[str]:
    by = _groups(rows)
    mean = {p: sum(r["emulator"]["time_to_target_s"] or float("inf") for r in rs) / len(rs)
            for (_s, p), rs in by.items()}
    return sorted(mean, key=lambda p: (mean[p], p))


def claims(comparisons: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The five claims over every held-out row, each with its falsifier and status.

    Repeats: comparisons of the same scenario are the emulator's repeats (its run-to-run noise). The
    time claim is judged per (scenario, policy) against the emulator's mean time over its repeats, and
    is "undecided" where the simulator misses the mean by more than the goal but lies inside the
    emulator's own range; the ranking claim against the ranking by mean time, "undecided" where the
    emulator's own repeats rank the policies differently. A difference inside the noise is no
    difference; with one run per policy there is no noise estimate and these are as before."""
    rows = [r for rs in comparisons.values() for r in rs]

    def status(bad: list[str], n: int, unsure: list[str] | None = None) -> str:
        return "not run" if n == 0 else ("falsified" if bad else "undecided" if unsure else "survived")

    groups = time_groups(rows)
    t_bad = [f"{g['scenario']}/{g['policy']}: " + (f"{g['error_vs_mean']:.1%} off the emulator's mean of "
                                                  f"{len(g['emulator_s'])} run(s)" if "error_vs_mean" in g else g["why"])
             for g in groups if g["verdict"] == "outside"]
    t_unsure = [f"{g['scenario']}/{g['policy']}: {g['error_vs_mean']:.1%} off the mean, inside the emulator's own "
                f"spread of {g['emulator_spread']:.1%}" for g in groups if g["verdict"] == "inside the emulator's spread"]
    b_bad, b_unsure = byte_verdicts(rows, "bytes", BYTE_CLASSES)
    w_rows = [r for r in rows if r["error"].get("wan_bytes")]
    w_bad, w_unsure = byte_verdicts(w_rows, "wan_bytes", WAN_CLASSES)
    l_bad, l_unsure = lost_token_verdicts(rows)
    n_l = sum(1 for r in rows if r["progress_triggered"])
    by_scen: dict[str, list[list[dict[str, Any]]]] = {}
    for rs in comparisons.values():
        if rs:
            by_scen.setdefault(rs[0]["scenario"], []).append(rs)
    k_bad, k_unsure = [], []
    for scen, comps in sorted(by_scen.items()):
        emu_ranks = [ranking(rs, "emulator") for rs in comps]
        sim_rank = ranking(comps[0], "simulator")
        mean_rank = _mean_ranking([r for rs in comps for r in rs])
        if sim_rank == mean_rank:
            continue
        line = f"{scen}: emulator {mean_rank if len(comps) > 1 else emu_ranks[0]} vs simulator {sim_rank}"
        if len({tuple(x) for x in emu_ranks}) > 1:
            k_unsure.append(f"{line}; the emulator's {len(comps)} repeats rank differently: {emu_ranks}")
        else:
            k_bad.append(line)
    return [
        {"claim": "time to target within 10 % of the emulator's",
         "falsifier": "a held-out scenario and policy whose simulated time to target is more than 10 % off the "
                      "emulator's mean over its repeats and outside the emulator's own range",
         "status": status(t_bad, len(groups), t_unsure), "against": t_bad, "undecided": t_unsure, "runs": len(rows),
         "groups": groups},
        {"claim": "bytes per class (collective, state transfer, checkpoint) within 2 %",
         "falsifier": "a held-out scenario and policy whose simulated bytes of one class are more than 2 % off the "
                      "emulator's mean over its repeats and outside their range",
         "status": status(b_bad, len(rows), b_unsure), "against": b_bad, "undecided": b_unsure, "runs": len(rows)},
        {"claim": "inter-site bytes per class through the WAN (collective, state transfer, checkpoint, control) "
                  "within 2 %",
         "falsifier": "a held-out scenario and policy whose WAN endpoints' bytes of one class are more than 2 % off "
                      "the emulator's mean over its repeats and outside their range",
         "status": status(w_bad, len(w_rows), w_unsure), "against": w_bad, "undecided": w_unsure,
         "runs": len(w_rows)},
        {"claim": "lost tokens exact for progress-triggered faults",
         "falsifier": "a held-out scenario with only progress-triggered faults whose simulated lost tokens differ "
                      "from the emulator's where its repeats agree, or lie outside their range where they do not",
         "status": status(l_bad, n_l, l_unsure), "against": l_bad, "undecided": l_unsure, "runs": n_l},
        {"claim": "the ranking of the policies by time to target is preserved",
         "falsifier": "a held-out scenario whose emulator ranking (by mean time over its repeats) differs from the "
                      "simulated one while the emulator's repeats agree on it",
         "status": status(k_bad, len(by_scen), k_unsure), "against": k_bad, "undecided": k_unsure,
         "runs": len(comparisons)},
    ]


def progress_triggered(emulated: Path) -> bool:
    p = emulated / "scenario.json"
    if not p.exists():
        return False
    faults = json.loads(p.read_text()).get("faults", [])
    return bool(faults) and all("at_useful_tokens" in f or "at_step" in f for f in faults)


def time_md(groups: list[dict[str, Any]]) -> str:
    """Time to target per (scenario, policy) against the emulator's repeats (time_groups)."""
    lines = ["| scenario | policy | emulator runs s | emulator mean s (spread) | simulator s | error vs mean | verdict |",
             "|---|---|---|---|---|---|---|"]
    for g in groups:
        if "error_vs_mean" not in g:
            lines.append(f"| {g['scenario']} | {g['policy']} | - | - | - | - | {g['verdict']} ({g['why']}) |")
            continue
        spread = "-" if g["emulator_spread"] is None else f"{100 * g['emulator_spread']:.1f} %"
        lines.append(f"| {g['scenario']} | {g['policy']} | {', '.join(f'{t:.1f}' for t in g['emulator_s'])} | "
                     f"{g['emulator_mean_s']:.1f} ({spread}) | {g['simulator_s']:.1f} | "
                     f"{100 * g['error_vs_mean']:.1f} % | {g['verdict']} |")
    return "\n".join(lines)


def table_md(comparisons: dict[str, list[dict[str, Any]]]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f} %"

    def num(x: Any, fmt: str = "{:.1f}") -> str:
        return "-" if x is None else fmt.format(x)

    head = ["| held-out | policy | time to target s emu / sim (err) | idle s emu / sim (err) | lost tokens emu / sim "
            "| collective / state / checkpoint bytes err | WAN collective / state / checkpoint / control err "
            "| recovery s emu / sim (err) |", "|---|---|---|---|---|---|---|---|"]
    lines = []
    for name, rs in comparisons.items():
        for r in rs:
            e, s, x = r["emulator"], r["simulator"], r["error"]
            lines.append(f"| {name} | {r['policy']} | {num(e['time_to_target_s'])} / {num(s['time_to_target_s'])} "
                         f"({pct(x['time_to_target'])}) | {num(e['idle_s'])} / {num(s['idle_s'])} ({pct(x['idle'])}) | "
                         f"{num(e['lost_tokens'], '{:,}')} / {num(s['lost_tokens'], '{:,}')} | "
                         + " / ".join(pct(x["bytes"][c]) for c in BYTE_CLASSES) + " | "
                         + (" / ".join(pct(x["wan_bytes"].get(c)) for c in WAN_CLASSES) if x.get("wan_bytes") else "-")
                         + f" | {num(e['recovery_s'])} / {num(s['recovery_s'])} ({pct(x['recovery'])}) |")
    return "\n".join(head + lines)
