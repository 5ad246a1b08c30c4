"""Bounded soak: random fault schedules against small real clusters, under every policy.

`python -m chaos.soak --schedules 20 [--policy elastic ...] [--out bench/results/soak.json]`

Each schedule is drawn from a seeded generator (kills with restart, hangs, link resets and
blackholes at random progress points). Every run must reach its frontier (the target's
useful samples), leave no torn or corrupt checkpoint (every manifest and blob in the store
re-verifies by hash) and balance its work ledger exactly. The tally goes to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario

ROUND_TOKENS = 12_288  # 3 sites x 8 samples x 4 inner steps x 128 tokens
ROUNDS = 10
SMALL: dict[str, Any] = {
    "train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": ROUNDS * ROUND_TOKENS,
              "eval_every_rounds": 5, "checkpoint_every_rounds": 2, "threads_per_site": 1, "device": "cpu"},
    "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}, "heartbeat_timeout_ms": 2000,
            "collective_stall_ms": 8000},
}


def random_schedule(seed: int, sites: tuple[str, ...] = ("a", "b", "c")) -> Scenario:
    """One to three faults at random progress points, each healed within a few seconds."""
    rng = random.Random(seed)
    sc = Scenario.build(f"soak-{seed}", "random kills, hangs and cuts", seed=seed)
    points = sorted(rng.sample(range(1, ROUNDS - 2), k=rng.randint(1, 3)))
    for p in points:
        at = p * ROUND_TOKENS
        kind = rng.choice(["crash", "hang", "reset", "blackhole"])
        site = rng.choice(sites)
        other = rng.choice([s for s in sites if s != site])
        if kind == "crash":
            sc = sc.crash(site, at_useful_tokens=at, restart_after_s=rng.uniform(1, 3))
        elif kind == "hang":
            sc = sc.hang(site, at_useful_tokens=at, duration_s=rng.uniform(1, 4))
        elif kind == "reset":
            sc = sc.reset(f"{site}<->{other}", at_useful_tokens=at, duration_s=rng.uniform(0.5, 2))
        else:
            sc = sc.blackhole(f"{site}<->{other}", at_useful_tokens=at, duration_s=rng.uniform(1, 3))
    return sc


def verify_store(run_dir: Path) -> tuple[bool, str]:
    """Every manifest and blob in the run's store re-verifies; the frontier loads."""
    from checkpoint_store.blobstore import BlobStore, StoreError

    try:
        store = BlobStore(run_dir / "store")
        manifests = store.manifests()
        for m in manifests.values():
            for sha in m["blobs"].values():
                store.verify_blob(sha)
        fr = store.frontier()
        return True, f"{len(manifests)} manifests verified; frontier {fr[0][:12] if fr else None}"
    except (StoreError, OSError, KeyError) as e:
        return False, f"{type(e).__name__}: {e}"


def soak_one(seed: int, policy: str, root: Path, keep: bool = True) -> dict[str, Any]:
    from xdc.compare import with_policy as _with_policy
    from xdc.config import load_config, merge
    from xdc.launcher import launch

    sc = random_schedule(seed)
    cfg = _with_policy(load_config(merge(SMALL, {"runs_dir": str(root)})), policy, sc)
    t0 = time.monotonic()
    run_dir, s = launch(cfg, quiet=True, timeout_s=600, scenario=sc)
    store_ok, store_detail = verify_store(run_dir)
    reached = s.get("useful_tokens") == ROUNDS * ROUND_TOKENS
    passed = reached and bool(s.get("work_balanced")) and store_ok
    if passed and not keep:
        shutil.rmtree(run_dir / "store", ignore_errors=True)  # checkpoints are most of a run's bytes
    return {"seed": seed, "policy": policy, "faults": [f"{f.kind}:{f.target}" for f in sc.faults],
            "run_dir": str(run_dir), "reached_frontier": reached, "ledger_balanced": bool(s.get("work_balanced")),
            "store_verified": store_ok, "store_detail": store_detail, "lost_tokens": s.get("lost_tokens"),
            "frontier_hash": s.get("frontier_hash"), "wall_s": round(time.monotonic() - t0, 1),
            "passed": passed, "interrupted": bool(s.get("interrupted"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.soak", description=__doc__)
    ap.add_argument("--schedules", type=int, default=20, help="random fault schedules per policy")
    ap.add_argument("--policy", action="append", choices=["stall", "restart", "elastic", "oracle"])
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default="bench/results/soak.json")
    ap.add_argument("--runs-dir", default=None, help="keep the runs here (default: a temp dir)")
    args = ap.parse_args(argv)
    policies = args.policy or ["stall", "restart", "elastic", "oracle"]
    root = Path(args.runs_dir) if args.runs_dir else Path(tempfile.mkdtemp(prefix="xdc-soak-"))
    results: list[dict[str, Any]] = []

    def write() -> dict[str, Any]:
        # Written after every run, so an interrupted soak still leaves an honest partial tally.
        tally = {p: {"runs": sum(1 for r in results if r["policy"] == p),
                     "passed": sum(1 for r in results if r["policy"] == p and r["passed"])} for p in policies}
        out = {"name": "soak", "schedules_per_policy": args.schedules, "tally": tally, "runs": results,
               "complete": len(results) == args.schedules * len(policies),
               "passed": bool(results) and all(r["passed"] for r in results)}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2, sort_keys=True))
        return out

    # Interleave the policies so a partial soak covers all of them.
    for i in range(args.schedules):
        for policy in policies:
            r = soak_one(args.seed + i, policy, root, keep=bool(args.runs_dir))
            if r["interrupted"]:  # Ctrl-C / SIGTERM stops the soak, not just the run in flight
                print(f"interrupted during {policy} seed {r['seed']}: the soak stops here (tally so far in "
                      f"{args.out})", flush=True)
                write()
                return 130
            results.append(r)
            write()
            print(f"{policy:8s} seed {r['seed']}: {'ok  ' if r['passed'] else 'FAIL'} {r['faults']} "
                  f"lost={r['lost_tokens']} {r['wall_s']} s", flush=True)
    out = write()
    print(json.dumps(out["tally"]))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
