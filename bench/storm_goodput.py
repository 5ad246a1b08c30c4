"""Goodput under a steady fault storm: step efficiency of every recovery policy.

Step efficiency = useful work of a run under the storm over the work a fault-free run of the same
length would have done. Both arms train the same configuration to the same useful-token target in
this one invocation (fault-free first, then each policy under the same storm), so
    efficiency(policy) = fault-free tokens/s * policy wall time ... inverted:
    efficiency(policy) = (target / T_policy) / (target / T_fault_free) = T_fault_free / T_policy,
with T = the coordinator's `coordinator_started` to `run_complete` (monotonic ns, from the logs).
The fault-free arm runs first and last; T_fault_free is their mean, and their gap (the machine's
drift over the invocation) is reported beside the efficiencies. Elastic also runs a second time
with the warm standby (`elastic+standby`); the goal is decided on plain elastic.

The storm: about one fault per minute of run time, by wall time, mixed kinds (crash with restart,
hang, link blackhole, link reset, preemption with notice and return), each on a different site or
link, durations on both sides of the detection thresholds. Anchors (issue 9): torchft's blog
reports 82.3 %, a DiLoCo fault-tolerance harness 85-88 % under kill/partition storms. Goal for
`elastic`: >= 0.92; all four policies are reported (`raw.per_policy`).

    python -m bench.storm_goodput [minutes_per_run] [--keep DIR]
    python -m bench.storm_goodput --reanalyze DIR    # the per-fault split again, from a kept invocation
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bench.common import env_info, write_result
from chaos.scenario import Scenario
from ground.config import POLICIES, load_config, merge
from ground.eventlog import read_events
from cluster.launcher import launch

NAME = "storm_goodput"
GOAL = 0.92
# Arms under the storm: each policy with the default config, and elastic once more with the
# launcher's warm standby (`recovery.warm_standby`: a restarted site is a process that has already
# imported torch and built the model). The goal is decided on plain elastic; the standby arm says
# what that option buys.
ARMS: dict[str, dict[str, Any]] = {**{p: {"recovery": {"policy": p}} for p in POLICIES},
                                   "elastic+standby": {"recovery": {"policy": "elastic", "warm_standby": True}}}
ROUND_TOKENS = 12_288  # 3 sites x 8 samples x 4 inner steps x 128 tokens
# Compute is charged per site: every inner step takes at least STEP_FLOOR_MS (train.step_floor_ms),
# above what a step takes when three sites share 2 cores (160-220 ms, soak logs of 2026-12-02). Without
# it a missing site cost nothing here (three CPU-bound sites on 2 cores train no faster than two: at
# 77fbd46 elastic measured 1.056, above a fault-free run). Each arm reports how much of its compute
# time the floor waited (`floor_wait_share`): near 0 would mean the host, not the floor, set the pace.
STEP_FLOOR_MS = 350.0
CFG: dict[str, Any] = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "eval_every_rounds": 10,
              "checkpoint_every_rounds": 4, "threads_per_site": 1, "device": "cpu", "step_floor_ms": STEP_FLOOR_MS},
    "wan": {"site_link": {"up": {"latency_ms": 10}, "down": {"latency_ms": 10}}, "heartbeat_timeout_ms": 2000},
}


def storm(minutes: float) -> Scenario:
    """One fault per minute from 30 s on, cycling through kinds, sites and links."""
    sc = Scenario.build("storm", f"about one fault per minute for {minutes:g} min, mixed kinds", seed=7)
    makers = [
        lambda s, t: s.crash("b", restart_after_s=5, at_s=t),
        lambda s, t: s.hang("c", at_s=t, duration_s=4),  # over the 2 s heartbeat timeout
        lambda s, t: s.blackhole("a<->b", at_s=t, duration_s=5),  # a and b cannot hear each other
        lambda s, t: s.reset("a<->c", at_s=t, duration_s=1),  # under the detection thresholds
        lambda s, t: s.preempt("a", grace_s=2, return_after_s=6, at_s=t),
        lambda s, t: s.hang("b", at_s=t, duration_s=1),  # shorter than the heartbeat timeout
    ]
    t, i = 30.0, 0
    while t < minutes * 60:
        sc = makers[i % len(makers)](sc, t)
        t, i = t + 60.0, i + 1
    return sc


def _span_ns(run_dir: Path, evs: list[dict[str, Any]]) -> tuple[int, int]:
    """(coordinator_started, last run_complete) of a run, monotonic ns, from its coordinator's events."""
    start = next(e["mono_ns"] for e in evs if e["event"] == "coordinator_started")
    done = [e["mono_ns"] for e in evs if e["event"] == "run_complete"]
    if not done:
        raise RuntimeError(f"{run_dir}: the run did not complete (no run_complete in coord.jsonl)")
    return start, done[-1]


def _active_s(run_dir: Path) -> float:
    start, end = _span_ns(run_dir, read_events(run_dir / "logs" / "coord.jsonl"))
    return (end - start) / 1e9


def progress_at(commits: list[tuple[int, int]], t: int) -> float:
    """A run's progress (useful tokens of its lineage) at mono ns `t`: 0 before its first commit, the
    commits' tokens linearly interpolated between them, the last commit's after it."""
    before = [(n, u) for n, u in commits if n <= t]
    if not before:
        return 0.0
    n0, u0 = before[-1]
    later = next(((n, u) for n, u in commits if n > t), None)
    if later is None:
        return float(u0)
    n1, u1 = later
    return u0 + (u1 - u0) * (t - n0) / (n1 - n0)


def time_to_reach(start_ns: int, commits: list[tuple[int, int]]) -> Callable[[float], float]:
    """The inverse of `progress_at` for a run that never rolls back (the fault-free arm): seconds from
    its start until its progress reached `tokens` (at most its last commit's time)."""
    pts = [(0.0, 0.0)] + [((n - start_ns) / 1e9, float(u)) for n, u in commits]

    def at(tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        for (t0, u0), (t1, u1) in zip(pts, pts[1:]):
            if u1 >= tokens:
                # progress_at jumps from 0 to the first commit's tokens at that commit
                return t1 if u0 == 0.0 or u1 == u0 else t0 + (t1 - t0) * (tokens - u0) / (u1 - u0)
        return pts[-1][0]
    return at


def loss_windows(start_ns: int, end_ns: int, commits: list[tuple[int, int]], faults: list[tuple[int, str]],
                 fault_free_s: Callable[[float], float]) -> list[dict[str, Any]]:
    """Where a storm run's lost time went: one window before the first fault, then one per fault (from
    its injection to the next fault's, or to the end of the run).

    `commits`: (mono ns, useful tokens of the lineage) in order (`progress_at`). `fault_free_s(u)`:
    the seconds the fault-free arm needed to reach progress u (`time_to_reach` of its commits), so
    start-up, evaluations and checkpoints cost the same in both arms. A window's lost time = its
    length - the time the fault-free arm took to make the same progress; the windows sum exactly to
    T_storm - T_fault_free. The first window has no fault: what it loses is the noise beside the others.
    A restart's rollback shows as negative progress in the window of the fault that caused it.
    (Until e7e6fdb the reference was the fault-free arm's mean rate, which charged every arm's
    start-up to its first window and credited it back in the fault windows.)
    """
    bounds = [start_ns] + [max(start_ns, min(t, end_ns)) for t, _ in faults] + [end_ns]
    labels = ["before the first fault"] + [label for _, label in faults]
    out = []
    for label, a, b in zip(labels, bounds, bounds[1:]):
        pa, pb = progress_at(commits, a), progress_at(commits, b)
        length = (b - a) / 1e9
        out.append({"window": label, "length_s": round(length, 3), "progress_tokens": round(pb - pa),
                    "lost_s": round(length - (fault_free_s(pb) - fault_free_s(pa)), 3)})
    return out


@dataclass(frozen=True)
class ArmTimeline:
    """What the storm benchmark reads of one arm's logs, read once: its span, commits and faults."""

    start_ns: int
    end_ns: int
    commits: list[tuple[int, int]]  # (mono ns, useful tokens of the lineage)
    faults: list[tuple[int, str]]  # (mono ns, "kind target") of every fault_injected

    @staticmethod
    def read(run_dir: Path, with_faults: bool = True) -> ArmTimeline:
        """`with_faults`: the arm ran a scenario, so its chaos.jsonl must be there (the fault-free arm has none)."""
        evs = read_events(run_dir / "logs" / "coord.jsonl")
        start, end = _span_ns(run_dir, evs)
        faults = [(e["mono_ns"], f"{e.get('kind')} {e.get('target')}")
                  for e in read_events(run_dir / "logs" / "chaos.jsonl") if e.get("event") == "fault_injected"] \
            if with_faults else []
        return ArmTimeline(start, end, [(e["mono_ns"], int(e["useful_tokens"])) for e in evs if e["event"] == "commit"],
                           faults)

    @property
    def active_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    def time_to_reach(self) -> Callable[[float], float]:
        return time_to_reach(self.start_ns, self.commits)

    def loss_by_fault(self, fault_free: ArmTimeline) -> list[dict[str, Any]]:
        return loss_windows(self.start_ns, self.end_ns, self.commits, self.faults, fault_free.time_to_reach())


def floor_wait_share(run_dir: Path) -> float | None:
    """The share of the sites' compute time spent waiting for the step floor (None: no compute logged).
    Well above 0: the floor set every site's pace, not the host's cores."""
    waited = total = 0.0
    for log in sorted((run_dir / "logs").glob("[a-z].jsonl")):
        for e in read_events(log):
            if e.get("event") == "compute" and "end_mono_ns" in e:
                total += (e["end_mono_ns"] - e["start_mono_ns"]) / 1e9
                waited += float(e.get("floor_wait_s") or 0.0)
    return waited / total if total > 0 else None


def reanalyze(keep: Path) -> dict[str, Any]:
    """Recompute the per-fault split of lost time of a kept invocation (`--keep DIR`) with this code's
    `loss_windows`, in bench/results/storm_goodput.json; nothing else in the result changes (the
    efficiencies are the arms' active times, read again and checked)."""
    import json
    import subprocess

    path = Path(__file__).resolve().parent / "results" / f"{NAME}.json"
    res = json.loads(path.read_text())
    ff = ArmTimeline.read(next((keep / "fault-free").glob("2*")), with_faults=False)
    for arm, rec in res["raw"]["per_policy"].items():
        tl = ArmTimeline.read(next((keep / arm).glob("2*")))
        if abs(tl.active_s - rec["active_s"]) > 1e-6:
            raise RuntimeError(f"{keep / arm}: active {tl.active_s} s, the result says {rec['active_s']} s: not its run")
        rec["loss_by_fault"] = tl.loss_by_fault(ff)
    rev = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True).stdout.strip()
    res["notes"] += (f" The loss_by_fault windows were recomputed from the kept runs ({keep}) at {rev} "
                     "(`python -m bench.storm_goodput --reanalyze DIR`): against the first fault-free arm's own "
                     "progress curve instead of its mean rate; the runs and the efficiencies are unchanged.")
    path.write_text(json.dumps(res, indent=2) + "\n")
    return res


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--reanalyze"]:
        res = reanalyze(Path(args[1]))
        for arm, rec in res["raw"]["per_policy"].items():
            print(f"{arm}: " + ", ".join(f"{w['window']} {w['lost_s']:.1f}" for w in rec["loss_by_fault"]))
        return 0
    keep = None
    if "--keep" in args:  # keep the run directories (their logs) there instead of a temporary directory
        i = args.index("--keep")
        keep = args[i + 1]
        del args[i:i + 2]
    minutes = float((args or ["4"])[0])
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="xdc-bench-storm-")) as tmp:
        # The fault-free arm sets the target: as many rounds as it trains in about `minutes`.
        probe = load_config(merge(merge(CFG, {"train": {"target_useful_tokens": 20 * ROUND_TOKENS}}),
                                  {"runs_dir": str(Path(tmp) / "probe")}))
        probe_dir, _ = launch(probe, quiet=True, timeout_s=1800)
        per_round_s = _active_s(probe_dir) / 20
        rounds = max(20, int(minutes * 60 / per_round_s))
        target = rounds * ROUND_TOKENS
        base = merge(CFG, {"train": {"target_useful_tokens": target}})
        # The fault-free arm runs first and last; its mean is the reference and the gap between the two
        # is the machine's drift over the invocation (the arms run one after another on shared cores):
        # an efficiency difference inside that gap is no difference.
        ff_dir, ff = launch(load_config(merge(base, {"runs_dir": str(Path(tmp) / "fault-free")})), quiet=True,
                            timeout_s=3600)
        ff_timeline = ArmTimeline.read(ff_dir, with_faults=False)  # its coordinator log, read once
        t_ff_first = ff_timeline.active_s
        scenario = storm(t_ff_first / 60)
        per_policy: dict[str, Any] = {}
        active: dict[str, float] = {}
        timelines: dict[str, ArmTimeline] = {}
        for arm, over in ARMS.items():
            cfg = load_config(merge(merge(base, over), {"runs_dir": str(Path(tmp) / arm)}))
            run_dir, s = launch(cfg, quiet=True, timeout_s=3600, scenario=scenario)
            timelines[arm] = tl = ArmTimeline.read(run_dir)
            active[arm] = tl.active_s
            fired = len(tl.faults)
            per_policy[arm] = {"active_s": active[arm], "useful_tokens": s.get("useful_tokens"),
                               "lost_tokens": s.get("lost_tokens"), "faults_fired": fired,
                               "floor_wait_share": floor_wait_share(run_dir),
                               "loadavg_1m_at_end": os.getloadavg()[0]}
            print(f"{arm}: {active[arm]:.1f} s ({fired} faults fired)", flush=True)
        ff2_dir, _ = launch(load_config(merge(base, {"runs_dir": str(Path(tmp) / "fault-free-last")})), quiet=True,
                            timeout_s=3600)
        t_ff_last = _active_s(ff2_dir)
        ff_floor_share = [floor_wait_share(ff_dir), floor_wait_share(ff2_dir)]
        t_ff = (t_ff_first + t_ff_last) / 2
        drift = abs(t_ff_last - t_ff_first) / t_ff
        for arm, rec in per_policy.items():
            rec["efficiency"] = t_ff / active[arm]
            rec["efficiency_vs_first_last"] = [t_ff_first / active[arm], t_ff_last / active[arm]]
            rec["loss_by_fault"] = timelines[arm].loss_by_fault(ff_timeline)
            print(f"{arm}: lost s by window: " + ", ".join(f"{w['window']} {w['lost_s']:.1f}"
                                                         for w in rec["loss_by_fault"]), flush=True)
            print(f"{arm}: efficiency {rec['efficiency']:.3f} (fault-free {t_ff_first:.1f} s first, "
                  f"{t_ff_last:.1f} s last)", flush=True)
    ratio = per_policy["elastic"]["efficiency"]
    # Two-sided: above 1 (+ the reference's drift) the storm arm did more than a fault-free run could, so
    # the reference does not measure what the goal asks (on 2 cores, 3 CPU-bound sites train no faster
    # than 2, and a site's absence costs no throughput): that is no evidence of meeting the goal.
    ok = GOAL <= ratio <= 1.0 + drift
    write_result(NAME, ratio=ratio, goal=f"{GOAL:.2f} <= elastic <= 1 + the fault-free drift", passed=ok,
                 reference="sequential",
                 measures=["coordinator/", "site_agent/", "site_core/", "wan/", "chaos/", "cluster/launcher.py", "bench/storm_goodput.py"],
                 raw={"target_useful_tokens": target, "fault_free_active_s": t_ff, "step_floor_ms": STEP_FLOOR_MS,
                      "fault_free_floor_wait_share": ff_floor_share,
                      "fault_free_first_last_s": [t_ff_first, t_ff_last], "fault_free_drift": drift,
                      "per_policy": per_policy,
                      "scenario": scenario.to_dict(), "fault_free_useful_tokens": ff.get("useful_tokens")},
                 env=env_info("v2.12.0"),
                 notes="step efficiency = fault-free active time / active time under the storm, same target, same "
                       f"config, measured in one invocation. Compute is charged per site: every inner step takes at "
                       f"least {STEP_FLOOR_MS:g} ms (train.step_floor_ms), above the contended step time of three "
                       "sites on this host's cores, so a missing site costs its share of throughput (each arm's "
                       "floor_wait_share says how much compute time the floor waited). "
                       "one fault per minute of the fault-free run's length "
                       "(crash+restart, hang, blackhole, reset, preemption, short hang in turn). The arms run one "
                       "after the other, so on a shared machine the load can differ between them (each arm's "
                       "1-minute load average is in raw.per_policy): the fault-free arm runs first and last, "
                       f"the reference is their mean ({t_ff_first:.1f} s, {t_ff_last:.1f} s: drift "
                       f"{100 * drift:.1f} %), and an efficiency difference inside that drift is no difference. "
                       "raw.per_policy[arm].loss_by_fault splits each arm's lost time (T_arm - T_fault_free first) "
                       "into a window before the first fault (the noise) and one window per fault, from its "
                       "injection to the next one's: a window's length minus the time the first fault-free arm "
                       "took to make the same progress. "
                       "'elastic+standby' is elastic with recovery.warm_standby (restarts hand the site to a "
                       "process that has imported torch and built the model); the goal is decided on plain "
                       "elastic.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
