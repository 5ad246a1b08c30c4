"""The soak: random fault schedules over every fault kind against small real clusters, under
every policy, each run judged by what its logs and its store prove.

`python -m bench.soak --schedules 20 [--policy elastic ...] [--out bench/results/soak.json]`

A schedule (seeded, reproducible) holds N_FAULTS faults of different kinds drawn from all nine
(crash, preemption with notice, hang, restart, link reset, blackhole, degradation, store outage,
coordinator crash). Triggers are by useful tokens, by step and by wall time (`at_s`); faults share
trigger points, so they overlap. Each duration is drawn on one side of the detection threshold
that governs it, taken from the run's config: the heartbeat timeout for a process and for a
site's link to the coordinator or all its links, the collective stall detector for a link
between two sites; below it (a blip no detector should act on) or above it (a failure it must
catch). A fault's `note` says which side and which threshold.

Each schedule runs under every policy in turn; a run passes only if every check of
`bench/soak_check.py` holds (target reached, every analysis checker passes, every process
exited 0, every checkpoint re-verifies and reloads to its hash, the frontier is the last
commit's state, every fault that fired is in chaos.jsonl), and the schedule's runs end at the
same frontier. The tally (written after every run, so an interrupted soak leaves an honest
partial one) counts faults injected by kind, recoveries the logs show, lost tokens, and
pass/fail per run with reasons.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario
from ground.faults import FAULT_KINDS as KINDS
from ground.eventlog import read_events
from ground.provenance import code_revision

ROUND_TOKENS = 12_288  # 3 sites x 8 samples x 4 inner steps x 128 tokens
ROUNDS = 10
TARGET_TOKENS = ROUNDS * ROUND_TOKENS  # 122,880 useful tokens
STEPS_PER_ROUND = 4
# Every inner step takes at least this long (train.step_floor_ms, an emulated device): a run then
# lasts at least ROUNDS x STEPS_PER_ROUND x 0.3 s = 12 s after the cluster forms on any host, so a
# wall-time trigger inside WALL_WINDOW_S always comes before the run ends. Without it a fast host
# finished a run at 14.6 s, before a crash due at 15.4 s, which then found its site already gone.
STEP_FLOOR_MS = 300
SMALL: dict[str, Any] = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": STEPS_PER_ROUND,
              "target_useful_tokens": TARGET_TOKENS, "eval_every_rounds": 5, "checkpoint_every_rounds": 2,
              "threads_per_site": 1, "device": "cpu", "step_floor_ms": STEP_FLOOR_MS},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 2000,
            "collective_stall_ms": 8000},
}
ALL_KINDS = tuple(k for k in KINDS if k != "noop")
N_FAULTS = 6  # per schedule: 20 schedules x 6 = 120 scheduled faults per policy
WALL_WINDOW_S = (3.0, 10.0)  # at_s triggers: before the floor's shortest run ends (see STEP_FLOOR_MS)
TARGET_FAULTS_PER_POLICY = 100
RUN_TIMEOUT_S = 360.0  # a healthy soak run takes under 2 min on 2 cores; past this it is stuck (and fails)
RECOVERY_GRACE_S = 10.0  # + both thresholds: how long after its heal a recovery still belongs to a fault


@dataclass(frozen=True)
class Thresholds:
    """The detection thresholds a fault's duration straddles (seconds, from the run's config)."""

    heartbeat_s: float
    stall_s: float

    @staticmethod
    def of(cfg: Any) -> "Thresholds":
        return Thresholds(cfg.wan.heartbeat_timeout_ms / 1000, cfg.wan.collective_stall_ms / 1000)


def soak_config(root: Path) -> Any:
    from ground.config import load_config, merge

    return load_config(merge(SMALL, {"runs_dir": str(root)}))


# --------------------------------------------------------------------------------- schedules


def _side(rng: random.Random, threshold_s: float, name: str) -> tuple[float, str]:
    """A duration below (0.3-0.8x) or above (1.3-2.5x) a threshold, and the note saying so."""
    if rng.random() < 0.5:
        d = round(rng.uniform(0.3, 0.8) * threshold_s, 2)
        return d, f"below {name} ({d:g} s < {threshold_s:g} s)"
    d = round(rng.uniform(1.3, 2.5) * threshold_s, 2)
    return d, f"above {name} ({d:g} s > {threshold_s:g} s)"


def _link(rng: random.Random, site: str, sites: tuple[str, ...], th: Thresholds) -> tuple[str, float, str]:
    """A link target and the threshold that governs it: between two sites only the collective's
    stall detector sees a cut; a site's link to the coordinator (or all its links) the heartbeat."""
    r = rng.random()
    if r < 0.6:
        other = rng.choice([s for s in sites if s != site])
        return f"{site}<->{other}", th.stall_s, "the collective stall detector"
    if r < 0.8:
        return f"{site}<->coord", th.heartbeat_s, "the heartbeat timeout"
    return site, th.heartbeat_s, "the heartbeat timeout"


def _trigger(rng: random.Random, how: str, point: int) -> dict[str, Any]:
    if how == "at_s":
        return {"at_s": round(rng.uniform(*WALL_WINDOW_S), 1)}
    if how == "at_step":
        return {"at_step": point * STEPS_PER_ROUND}
    return {"at_useful_tokens": point * ROUND_TOKENS}


def _fault(rng: random.Random, kind: str, site: str, sites: tuple[str, ...], th: Thresholds,
           trig: dict[str, Any]) -> dict[str, Any]:
    """One fault as `Scenario.add` keywords, its duration on a drawn side of its threshold."""
    hb = "the heartbeat timeout"
    if kind == "site_restart":
        return {"kind": kind, "target": site, **trig, "note": "instant: killed and restarted at once"}
    if kind in ("site_crash", "site_hang", "coord_crash", "store_outage"):
        d, note = _side(rng, th.heartbeat_s, hb)
        target = {"coord_crash": "coord", "store_outage": "store"}.get(kind, site)
        params = {"mode": rng.choice(["stop", "kill"])} if kind == "store_outage" else {}
        return {"kind": kind, "target": target, **trig, "duration_s": d, "note": note, **params}
    if kind == "site_preempt":
        grace = round(rng.uniform(0.5, 2.0), 2)
        d, note = _side(rng, th.heartbeat_s, hb)
        return {"kind": kind, "target": site, **trig, "duration_s": round(grace + d, 2), "grace_s": grace,
                "note": f"back {note} after its {grace:g} s notice"}
    link, threshold, name = _link(rng, site, sites, th)
    d, note = _side(rng, threshold, name)
    extra: dict[str, Any] = {}
    if kind == "link_degrade":
        extra = {"latency_ms": rng.choice([40, 80, 150]), "jitter_ms": rng.choice([0, 10, 30]),
                 "bandwidth_kbps": rng.choice([300, 600, 1500])}
    return {"kind": kind, "target": link, **trig, "duration_s": d, "note": note, **extra}


def _kinds(rng: random.Random, sites: tuple[str, ...], n: int) -> list[str]:
    """N_FAULTS different kinds, at most one process fault per site (two faults on one process could
    collide: a hang injected into a crashed site has nothing to stop)."""
    while True:
        kinds = rng.sample(ALL_KINDS, k=n)
        if sum(k.startswith("site_") for k in kinds) <= len(sites):
            return kinds


def random_schedule(seed: int, sites: tuple[str, ...] = ("a", "b", "c"), th: Thresholds | None = None,
                    n_faults: int = N_FAULTS) -> Scenario:
    """`n_faults` (3-9) faults of different kinds: one by wall time, one by step, the rest by useful
    tokens, on n_faults - 2 progress points (so at least two faults share one and overlap)."""
    if not 3 <= n_faults <= len(ALL_KINDS):
        raise ValueError(f"n_faults must be 3..{len(ALL_KINDS)}, got {n_faults}")
    rng = random.Random(seed)
    th = th or Thresholds(SMALL["wan"]["heartbeat_timeout_ms"] / 1000, SMALL["wan"]["collective_stall_ms"] / 1000)
    kinds = _kinds(rng, sites, n_faults)
    pool = list(sites)
    rng.shuffle(pool)
    targets = [pool.pop() if k.startswith("site_") else rng.choice(sites) for k in kinds]
    points = sorted(rng.sample(range(1, ROUNDS - 2), k=n_faults - 2))
    points = sorted(points + rng.sample(points, k=2))  # two faults share a point with another
    hows = ["at_s", "at_step"] + ["at_useful_tokens"] * (n_faults - 2)
    rng.shuffle(hows)
    sc = Scenario.build(f"soak-{seed}", f"{n_faults} faults over every kind, by progress and wall time, "
                                        "overlapping; durations around the detection thresholds", seed=seed)
    for kind, site, how, point in zip(kinds, targets, hows, points):
        kw = _fault(rng, kind, site, sites, th, _trigger(rng, how, point))
        sc = sc.add(kw.pop("kind"), kw.pop("target"), sites=sites, **kw)
    return sc


# --------------------------------------------------------------------------------------- runs


def soak_one(seed: int, policy: str, root: Path, n_faults: int = N_FAULTS) -> dict[str, Any]:
    """One schedule under one policy: run it, judge it, list what fired and what it caused."""
    from bench.soak_check import judge_run, recoveries
    from chaos.policy_config import config_for_policy as with_policy
    from chaos.reach import run_end
    from cluster.launcher import launch

    base = soak_config(root)
    sc = random_schedule(seed, tuple(base.cluster.sites), Thresholds.of(base), n_faults)
    cfg = with_policy(base, policy, sc)
    target, _step = run_end(cfg)
    t0 = time.monotonic()
    run_dir, s = launch(cfg, quiet=True, timeout_s=RUN_TIMEOUT_S, scenario=sc)
    wall = round(time.monotonic() - t0, 1)
    j = judge_run(run_dir, s, sc, target)
    th = Thresholds.of(cfg)
    grace = th.heartbeat_s + th.stall_s + RECOVERY_GRACE_S
    counts, per_fault = recoveries(run_dir, list(cfg.cluster.sites), grace) if s else ({}, {})
    heal_failures = [e.get("fault") for e in read_events(run_dir / "logs" / "chaos.jsonl")
                     if e.get("event") == "fault_failed" and e.get("phase") == "heal"] if s else []
    status = {f["index"]: f["status"] for f in (s.get("chaos") or {}).get("faults", [])}
    fired = set((s.get("chaos") or {}).get("fired", []))
    faults = [{"index": i, **f.to_dict(), "status": status.get(i), "fired": i in fired,
               "heal_failures": heal_failures.count(i), "recoveries": per_fault.get(i, [])}
              for i, f in enumerate(sc.faults)]
    return {"seed": seed, "policy": policy, "run_dir": str(run_dir), "passed": j.passed, "reasons": j.reasons,
            "verdicts": {v.name: {"ok": v.ok, "detail": v.detail} for v in j.verdicts}, "checks": j.checks,
            "faults": faults, "recoveries": counts, "lost_tokens": s.get("lost_tokens"),
            "useful_tokens": s.get("useful_tokens"), "frontier_hash": s.get("frontier_hash"), "wall_s": wall,
            "interrupted": bool(s.get("interrupted")) or not s}


def judge_schedule(group: list[dict[str, Any]], out: Path) -> None:
    """Same frontier across the schedule's runs that reached the target; a failure fails them all."""
    from bench.soak_check import same_frontier

    reached = [r for r in group if r["verdicts"].get("reached_target", {}).get("ok")]
    v = same_frontier([Path(r["run_dir"]) for r in reached], out)
    for r in reached:
        r["verdicts"]["same_frontier"] = {"ok": v.ok, "detail": v.detail}
        if not v.ok:
            r["passed"] = False
            r["reasons"].append(f"same_frontier: {v.detail}")


# -------------------------------------------------------------------------------------- tally


def _by_side(faults: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Fired faults per (kind, side of its threshold): how many the cluster recovered from (a
    failure detected, an epoch formed) and how many it rode out."""
    out: dict[str, dict[str, int]] = {}
    for f in faults:
        if not f["fired"]:
            continue
        note = f.get("note", "")
        side = "above" if "above" in note else "below" if "below" in note else "instant"
        row = out.setdefault(f"{f['kind']}:{side}", {"fired": 0, "with_failure_detected": 0})
        row["fired"] += 1
        row["with_failure_detected"] += int(any(r == "site_failed" for r in f["recoveries"]))
    return dict(sorted(out.items()))


def tally(results: list[dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in policies:
        rs = [r for r in results if r["policy"] == p]
        faults = [f for r in rs for f in r["faults"]]
        by_kind: dict[str, int] = {k: 0 for k in ALL_KINDS}
        recov: dict[str, int] = {}
        for f in faults:
            by_kind[f["kind"]] += int(f["fired"])
        for r in rs:
            for k, n in r["recoveries"].items():
                recov[k] = recov.get(k, 0) + n
        lost = [r["lost_tokens"] for r in rs if isinstance(r["lost_tokens"], int)]
        injected = sum(by_kind.values())
        out[p] = {"runs": len(rs), "passed": sum(1 for r in rs if r["passed"]),
                  "failed": [{"seed": r["seed"], "reasons": r["reasons"]} for r in rs if not r["passed"]],
                  "faults_scheduled": len(faults), "faults_injected": injected,
                  "faults_never_fired": sum(1 for f in faults if not f["fired"]),
                  "faults_injected_by_kind": by_kind,
                  "faults_without_recovery": sum(1 for f in faults if f["fired"] and not f["recoveries"]),
                  "faults_by_side": _by_side(faults),
                  "heal_failures": sum(f["heal_failures"] for f in faults),
                  "recoveries": dict(sorted(recov.items())),
                  "lost_tokens": {"total": sum(lost), "median": statistics.median(lost) if lost else None,
                                  "max": max(lost) if lost else None},
                  "target_faults_per_policy": TARGET_FAULTS_PER_POLICY,
                  "target_met": injected >= TARGET_FAULTS_PER_POLICY}
    return out


def _write(path: Path, results: list[dict[str, Any]], policies: list[str], args: argparse.Namespace,
           root: Path, started_at: dict[str, Any]) -> dict[str, Any]:
    # The revision each run was launched at (its processes import the tree then); read at the
    # first write, the file's own rewrites would have made every later one look "dirty".
    revs = sorted({r["code_revision"] for r in results if r.get("code_revision")})
    out = {"name": "soak", "command": " ".join(["python -m bench.soak", *sys.argv[1:]]),
           "code_revision": started_at if len(revs) <= 1 else {**started_at, "runs_at": revs},
           "schedules_per_policy": args.schedules, "first_seed": args.seed,
           "generator": {"faults_per_schedule": N_FAULTS, "kinds": list(ALL_KINDS), "rounds": ROUNDS,
                         "target_useful_tokens": TARGET_TOKENS, "config": SMALL, "wall_window_s": WALL_WINDOW_S},
           "runs_dir": str(root), "tally": tally(results, policies), "runs": results,
           "complete": len(results) == args.schedules * len(policies),
           "passed": bool(results) and all(r["passed"] for r in results)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=20, help="random fault schedules (each under every policy)")
    ap.add_argument("--policy", action="append", choices=["stall", "restart", "elastic", "oracle"])
    ap.add_argument("--seed", type=int, default=1000, help="seed of the first schedule")
    ap.add_argument("--out", default="bench/results/soak.json")
    ap.add_argument("--runs-dir", default=None, help="keep every run here (default: a temp dir; the stores of "
                                                     "passed runs are deleted, failed runs are kept whole)")
    args = ap.parse_args(argv)
    policies = args.policy or ["stall", "restart", "elastic", "oracle"]
    root = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="xdc-soak-"))
    started_at = code_revision()
    out_path = Path(args.out)
    results: list[dict[str, Any]] = []
    for i in range(args.schedules):
        group: list[dict[str, Any]] = []
        for policy in policies:  # one schedule under every policy, then the next
            rev = code_revision()
            r = soak_one(args.seed + i, policy, root)
            r["code_revision"] = f"{rev['commit']}{'+dirty' if rev['dirty'] else ''}"
            if r["interrupted"]:  # Ctrl-C / SIGTERM stops the soak, not just the run in flight
                print(f"interrupted during {policy} seed {r['seed']}: the soak stops here (tally so far in "
                      f"{out_path})", flush=True)
                _write(out_path, results + group, policies, args, root, started_at)
                return 130
            group.append(r)
            _write(out_path, results + group, policies, args, root, started_at)  # an interrupted soak keeps its tally
            fired = sum(f["fired"] for f in r["faults"])
            print(f"{policy:8s} seed {r['seed']}: {'ok  ' if r['passed'] else 'FAIL'} {fired}/{len(r['faults'])} "
                  f"faults fired, lost={r['lost_tokens']} {r['wall_s']} s {'; '.join(r['reasons'])[:300]}",
                  flush=True)
        judge_schedule(group, root / f"schedule-{args.seed + i}-analysis")
        results.extend(group)
        _write(out_path, results, policies, args, root, started_at)
        if not args.runs_dir:
            for r in group:
                if r["passed"]:  # checkpoints are most of a run's bytes; failed runs stay whole
                    shutil.rmtree(Path(r["run_dir"]) / "store", ignore_errors=True)
    out = _write(out_path, results, policies, args, root, started_at)
    print(json.dumps({p: {k: t[k] for k in ("runs", "passed", "faults_injected", "recoveries", "lost_tokens")}
                      for p, t in out["tally"].items()}))
    print(f"runs in {root}; tally in {out_path}")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
