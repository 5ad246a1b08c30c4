"""insider_flood: does an insider's flood make the coordinator suspect an honest member at torchft's settings?

Issue 54 asks for heartbeats under a coordinator flood measured at the recovery benchmark's detection
settings. Each run is the recovery benchmark's recipe at its 300 ms setting (heartbeat timeout and
disconnect grace 300 ms, a heartbeat every 100 ms; `bench.recovery_torchft.arm_config`), in sync and
in DiLoCo mode alternately, with site c started as `tests.insider_site`: the real agent with its own
cluster key, which trains as a member and meanwhile floods the coordinator with 3,000 telemetry
messages, claims a and b unreachable, forges a durable checkpoint and manifests, opens uploads and
reads a blob over and over (tests/insider_site.py). Counted per run: `site_suspected` and
`site_failed` events naming an honest member (a or b), and the coordinator's largest heartbeat gap
per honest member. Goal: no false suspicion in any run; every run reaches its target cleanly with
the attacks sent.

    python -m bench.insider_flood [--repeats N]    # N runs per mode (default 5)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import env_info, write_result
from bench.recovery_torchft import arm_config
from ground.config import load_config
from ground.eventlog import process_events
from tests.insider_site import launch_with_insider

HONEST = ("a", "b")
TIMEOUT_MS = 300
MODES = ("sync", "local")


def measure(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    coord = process_events(run_dir, "coord")
    false = [f"{e['event']} {e['site']}: {e.get('reason', '')}" for e in coord
             if e["event"] in ("site_suspected", "site_failed") and e["site"] in HONEST]
    stats = [e for e in coord if e["event"] == "heartbeat_stats"]
    gaps = {s: stats[-1]["sites"].get(s, {}).get("max_gap_ms") for s in HONEST} if stats else {}
    attacked = (run_dir / "insider.json").is_file()
    return {"false_suspicions": false, "max_gap_ms": gaps, "attacks_sent": attacked,
            "clean_exit": bool(summary.get("clean_exit")), "loadavg_1m": os.getloadavg()[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.insider_flood", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="runs per mode; the modes alternate")
    args = ap.parse_args(argv)
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="xdc-bench-insider-") as tmp:
        for i in range(args.repeats * len(MODES)):
            mode = MODES[i % len(MODES)]
            cfg = load_config(arm_config(mode, TIMEOUT_MS, str(Path(tmp) / str(i))))
            run_dir, summary = launch_with_insider(cfg)
            m = {"mode": mode, **measure(run_dir, summary)}
            samples.append(m)
            print(f"run {i}: {json.dumps(m)}", flush=True)
    false = sum(len(m["false_suspicions"]) for m in samples)
    ok = bool(samples) and false == 0 and all(m["attacks_sent"] and m["clean_exit"] for m in samples)
    gaps = [g for m in samples for g in m["max_gap_ms"].values() if g is not None]
    write_result("insider_flood", ratio=float(false), goal="no honest member suspected (count == 0), every run clean "
                                                           "with the attacks sent",
                 passed=ok, reference="fixed_goal",
                 measures=["coordinator/", "wan/", "site_agent/", "site_core/", "checkpoint_store/", "cluster/",
                           "tests/insider_site.py", "bench/insider_flood.py"],
                 raw={"samples": samples, "timeout_ms": TIMEOUT_MS}, env=env_info("v2.12.0"),
                 notes=f"{len(samples)} runs ({args.repeats} per mode, sync and DiLoCo alternating) at a {TIMEOUT_MS} ms "
                       f"heartbeat timeout with site c flooding the coordinator and the store (tests/insider_site.py): "
                       f"{false} suspicions or failures of a or b; honest members' largest heartbeat gap "
                       f"{min(gaps):.0f}-{max(gaps):.0f} ms; attacks sent in "
                       f"{sum(m['attacks_sent'] for m in samples)} of {len(samples)}; clean exits "
                       f"{sum(m['clean_exit'] for m in samples)}. 1-minute load average per run: "
                       f"{[round(m['loadavg_1m'], 1) for m in samples]}." if gaps else "no heartbeat statistics")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
