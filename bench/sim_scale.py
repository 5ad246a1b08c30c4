"""Benchmark: a simulated 1,000-site run of one simulated hour (sim/), timed on this machine.

The run: 1,000 sites under the default config (DiLoCo local mode, H=8) and the elastic policy, one
site crashing at 20 simulated minutes and restarting a minute later, heartbeats coalesced to one per
half heartbeat timeout (the core keeps only the last; a live site is never late). No logs are
written (the run directory of 1,000 sites would be the benchmark). Every decision goes through
coordinator/core.py, whose share of the time is measured (wall seconds inside `core.step`).

Result: ratio = wall_s / 10 s (goal <= 1: "a 1,000-site simulated hour in under 10 s"). With
--budget-s the virtual clock stops when the wall budget is spent; the result then says how far it
got and the hour's wall time is an extrapolation, labelled so.

    python -m bench.sim_scale [--sites 1000] [--sim-s 3600] [--budget-s 0]
"""

from __future__ import annotations

import argparse
import resource
import time

from bench.common import env_info, write_result
from chaos.scenario import Scenario
from ground.config import load_config
from sim.cli import site_names
from sim.model import SimModel
from sim.world import simulate

GOAL_S = 10.0
HOUR_S = 3600.0


def run(sites: int, sim_s: float, budget_s: float) -> dict:
    names = site_names(sites)
    cfg = load_config({"run_id": "bench-sim-scale", "cluster": {"sites": names},
                       "train": {"target_useful_tokens": 10 ** 13}, "recovery": {"policy": "elastic"}})
    scen = Scenario.build("scale", "one crash at a third of the run, back a minute later").crash(
        names[len(names) // 2], at_s=sim_s / 3, restart_after_s=60)
    model = SimModel(heartbeat_period_ms=cfg.wan.heartbeat_timeout_ms // 2)
    cpu0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + budget_s if budget_s > 0 else None
    res = simulate(cfg, scen, model, max_sim_s=sim_s,
                   wall_stop=(lambda: time.perf_counter() > deadline) if deadline else None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"sites": sites, "sim_s_asked": sim_s, "sim_s_reached": res.sim_s, "wall_s": wall, "cpu_s": cpu,
            "core_steps": res.core_steps, "core_s": res.core_s, "core_share": res.core_s / wall if wall else None,
            "core_by_kind": {k: {"inputs": c, "core_s": s, "us_each": 1e6 * s / c if c else None}
                             for k, (c, s) in sorted(res.core_by_kind.items(), key=lambda kv: -kv[1][1])},
            "events": res.events_run, "commits": res.commits, "epochs": res.epochs,
            "useful_tokens": res.useful_tokens, "heartbeat_period_ms": model.heartbeat_period_ms,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=1000)
    ap.add_argument("--sim-s", type=float, default=3600.0)
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop after this many wall seconds (0: never)")
    args = ap.parse_args(argv)
    raw = run(args.sites, args.sim_s, args.budget_s)
    # "The hour" is one simulated hour, whatever --sim-s asked: a shorter run is extrapolated to it.
    done = args.sim_s >= HOUR_S and raw["sim_s_reached"] >= HOUR_S - 60  # the last event before the hour's end
    scale = HOUR_S / max(raw["sim_s_reached"], 1e-9)
    hour_wall = raw["wall_s"] * scale
    raw["hour_wall_s"] = hour_wall
    raw["hour_cpu_s"] = raw["cpu_s"] * scale  # one thread: wall on an idle box
    raw["hour_wall_evidence"] = "measured" if done else "extrapolated (linear in simulated time)"
    ratio = hour_wall / GOAL_S
    # The floor: the core's own seconds for the hour (every site's heartbeat and report is one core
    # input; the simulator around it costing nothing). Above the goal, no work outside the core meets it.
    raw["hour_core_floor_s"] = raw["core_s"] * scale
    kinds = ", ".join(f"{k} {v['inputs'] * scale:,.0f} x {v['us_each']:.1f} us" for k, v in raw["core_by_kind"].items()
                      if v["core_s"] * scale >= 0.5)
    notes = (f"{args.sites} sites, {raw['sim_s_reached']:.0f} of {args.sim_s:.0f} simulated s in "
             f"{raw['wall_s']:.1f} wall s ({raw['cpu_s']:.1f} CPU s); coordinator core {raw['core_s']:.1f} s over "
             f"{raw['core_steps']:,} messages and ticks "
             f"({100 * (raw['core_share'] or 0):.0f}% of the wall time); the hour: {hour_wall:.0f} wall s, "
             f"{raw['hour_cpu_s']:.0f} CPU s ({raw['hour_wall_evidence']}). Shared 2-core machine: wall time "
             "is noisy; the simulator is one thread, so its CPU time is what an idle machine's wall time would be. "
             f"The core alone takes {raw['hour_core_floor_s']:.1f} s of the hour ({kinds}), leaving "
             f"{max(0.0, GOAL_S - raw['hour_core_floor_s']):.1f} s of the {GOAL_S:.0f} s goal for everything around it; "
             "the core already takes an instant's heartbeats or reports as one input (core.Messages) but still "
             "writes one record per site and message, so below that floor the goal needs fewer records (cohort "
             "sites), not only a faster simulator around it.")
    goal = f"<= 1 (a {args.sites}-site simulated hour in <= {GOAL_S:.0f} s)"
    write_result("sim_scale", ratio=ratio, goal=goal, passed=ratio <= 1.0, raw=raw,
                 env=env_info("not used (no network in a simulation)"), notes=notes, reference="fixed_goal",
                 measures=["sim", "site_core", "coordinator", "ground", "control", "chaos/scenario.py"])
    return 0 if ratio <= 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
