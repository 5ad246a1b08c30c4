"""One scenario under several recovery policies: four run directories and an index.

`run_comparison` is what `xdc compare` and `xdc demo` run; the tests use it too, so the index
they analyse is the one a user gets.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from analysis.run_numbers import matched_frontier
from chaos.reach import check_scenario_fits
from chaos.policy_config import config_for_policy
from ground.config import POLICIES, RunConfig
from ground.eventlog import read_events


def busy_cores(window_s: float = 0.5) -> float:
    """Cores kept busy by other work right now: the non-idle share of /proc/stat's CPU time over
    window_s, times the cores (the 1-minute load average instead where /proc/stat is missing; it
    lags, and would still count the sites that just finished)."""
    import os
    import time

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:]]
        return sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0)  # total, idle + iowait

    try:
        t1, i1 = sample()
        time.sleep(window_s)
        t2, i2 = sample()
    except OSError:
        return os.getloadavg()[0]
    return (os.cpu_count() or 1) * (1.0 - (i2 - i1) / max(1, t2 - t1))


def reference_threads(cores: int, busy: float) -> int:
    """torch threads for the reference, which runs alone after the policies: every core, unless
    other work keeps at least half of them busy. Then intra-op threads wait on each other's time
    slices: on the 2-core development machine at load ~20, 2 threads trained about 5x fewer
    tokens per CPU-second than 1 (24,576 tokens in 19 CPU-s vs ~3.5 CPU-s)."""
    return cores if busy < cores / 2 else 1


def run_reference_process(cfg: RunConfig, out: Path, timeout_s: float | None = None) -> dict[str, Any]:
    """The single-process reference (xdc/reference.py) of `cfg`, as a child process writing
    out/reference/logs/reference.jsonl; returns {"dir", "final_heldout_nll", "wall_s"} or {"error"}."""
    import os
    import subprocess
    import sys
    import time

    from ground.config import save_config

    ref_dir = out / "reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    save_config(replace(cfg, run_id="reference", runs_dir=str(out)), ref_dir / "config.json")
    t0 = time.monotonic()
    threads = str(reference_threads(os.cpu_count() or 1, busy_cores()))
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    try:
        p = subprocess.run([sys.executable, "-m", "xdc.reference", "--config", str(ref_dir / "config.json"),
                            "--out", str(ref_dir), "--threads", threads], env=env, capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"dir": str(ref_dir), "error": f"timed out after {timeout_s} s"}
    (ref_dir / "reference.out").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        return {"dir": str(ref_dir), "error": f"exit {p.returncode}; see {ref_dir / 'reference.out'}"}
    events = read_events(ref_dir / "logs" / "reference.jsonl")
    final = [e["heldout_nll"] for e in events if e.get("event") == "eval"][-1]
    return {"dir": str(ref_dir.resolve()), "final_heldout_nll": final, "wall_s": round(time.monotonic() - t0, 1)}


def run_comparison(cfg: RunConfig, scenario: Any, out: Path, policies: tuple[str, ...] | list[str] = POLICIES, *,
                   quiet: bool = True, timeout_s: float | None = None,
                   on_run: Any = None, allow_unfired: bool = False, reference: bool = True) -> dict[str, Any]:
    """Run every policy in turn, then (reference=True) the single-process reference over the same
    samples; write out/index.json. Stops early (index["interrupted"]) on Ctrl-C.
    A scenario with a progress trigger past the target raises ScenarioBeyondRun unless allow_unfired."""
    from cluster.launcher import launch, new_run_id

    check_scenario_fits(cfg, scenario, allow_unfired=allow_unfired)
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"scenario": scenario.to_dict(), "runs": [], "interrupted": False}
    for policy in policies:
        pcfg = config_for_policy(replace(cfg, runs_dir=str(out), run_id=f"{policy}-{new_run_id()}"), policy, scenario)
        if on_run is not None:
            on_run(policy)
        kw = {"timeout_s": timeout_s} if timeout_s is not None else {}
        run_dir, summary = launch(pcfg, quiet=quiet, scenario=scenario, **kw)
        if on_run is not None:
            on_run(policy, run_dir, summary)
        if not summary or summary.get("interrupted"):
            index["interrupted"] = True
            break
        index["runs"].append({"policy": policy, "run_dir": str(Path(run_dir).resolve()),
                              **{k: summary.get(k) for k in ("useful_tokens", "attempted_tokens", "retained_tokens",
                                                             "lost_tokens", "frontier_hash", "final_heldout_nll",
                                                             "work_balanced")},
                              "never_fired": (summary.get("chaos") or {}).get("never_fired", [])})
    if reference and not index["interrupted"]:
        index["reference"] = run_reference_process(cfg, out, timeout_s)
    # The artifact's own test, on the hashes the runs logged (the artifact adds the recomputed proofs).
    index["matched_frontier"] = matched_frontier([r["frontier_hash"] for r in index["runs"]])
    (out / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return index
