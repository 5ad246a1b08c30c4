"""A digest of every log line the simulator writes for a fixed set of scenarios: the check that a
change meant to make the simulator faster changed nothing it decides or logs.

Runs `xdc sim run` for 8 scenario x site-count cases under all four policies (targets that reach every
fault's trigger: about 8 s in all; digests from before 08398a7 ran one-outage without its crash and
do not compare with later ones) and writes {log file: sha256 of its records} to OUT.json, fields that hold host
time or host identity left out. Compare two digests (before and after a change) with `diff`.

    python -m bench.sim_digest /tmp/before      # at the parent commit
    python -m bench.sim_digest /tmp/after       # with the change
    diff /tmp/before.json /tmp/after.json       # empty: the same 344 files, byte for byte
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

# (scenario, sites, target useful tokens): each target reaches every progress trigger of its scenario
# (`xdc sim run` refuses one that cannot fire; before it did, the one-outage cases ran without the crash).
CASES = [("one-outage", 3, 1_179_648), ("churn", 3, 393_216), ("fault-storm", 3, 393_216), ("partition", 3, 393_216),
         ("flapping-link", 5, 393_216), ("preemption", 3, 393_216), ("straggler", 4, 393_216),
         ("one-outage", 30, 1_179_648)]
HOST_FIELDS = ("host", "pid", "argv", "python", "git", "started_at", "host_wall_ns", "elapsed_s", "wall_s",
               "cpu_s_host")


def digest(out: Path) -> dict[str, str]:
    from sim.cli import main

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    real_strftime = time.strftime
    time.strftime = lambda *a, **k: "FIXED"  # type: ignore[assignment]  (the manifests' date)
    try:
        for scen, n, target in CASES:
            rc = main(["run", f"scenarios/{scen}.yaml", "--sites", str(n), "--policy", "all", "--out",
                       str(out / f"{scen}-{n}"), "--set", f"train.target_useful_tokens={target}"])
            if rc:
                raise SystemExit(f"{scen} at {n} sites: xdc sim run exited {rc}")
    finally:
        time.strftime = real_strftime
    res: dict[str, str] = {}
    for f in sorted(glob.glob(str(out / "**/*.jsonl"), recursive=True)):
        h = hashlib.sha256()
        for line in open(f):
            try:
                e = json.loads(line)
            except ValueError:
                h.update(line.encode())
                continue
            if isinstance(e, dict):
                for k in HOST_FIELDS:
                    e.pop(k, None)
            h.update(json.dumps(e, sort_keys=True).encode())
        res[os.path.relpath(f, out)] = h.hexdigest()[:16]
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="directory for the runs; the digest goes to OUT.json")
    args = ap.parse_args(argv)
    res = digest(args.out)
    Path(f"{args.out}.json").write_text(json.dumps(res, indent=0, sort_keys=True))
    print(f"{len(res)} log files digested -> {args.out}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
