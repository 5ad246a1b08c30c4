"""Run the benchmarks (all, or the named ones) and print a markdown table of their ratios.

    python -m bench.run_all                      # all of them (`make bench`)
    python -m bench.run_all wan_fidelity ...     # only these

Each benchmark runs in its own Python process (so torch thread settings, sockets and Toxiproxy of
one cannot leak into the next) and writes bench/results/<name>.json. The table is printed and
written to bench/results/README-table.md. Exit status: 0 if every benchmark ran and met its goal,
1 if one missed its goal, 2 if one could not run (no result written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, ROOT

BENCHMARKS = ["wan_fidelity", "collective_efficiency", "emulator_overhead", "heartbeat_under_load", "recovery",
              "analysis_speed"]
# A benchmark module that writes more than one result file.
RESULT_NAMES = {"recovery": ["recovery_failover", "recovery_rejoin"]}


def _row(name: str, result: dict | None, error: str | None) -> str:
    if result is None:
        return f"| {name} | ERROR | - | no result ({error}) |"
    return f"| {name} | {result['ratio']:.4f} | {result['goal']} | {'yes' if result['passed'] else 'NO'} |"


def main(argv: list[str] | None = None) -> int:
    names = list(argv if argv is not None else sys.argv[1:]) or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {BENCHMARKS}", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    status = 0
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for name in names:
        t0 = time.time()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, "-m", f"bench.{name}"], cwd=ROOT, env=env)
        print(f"== {name}: {time.time() - t0:.1f} s", flush=True)
        for rname in RESULT_NAMES.get(name, [name]):
            path = RESULTS / f"{rname}.json"
            result, error = None, None
            if path.exists() and path.stat().st_mtime >= t0:
                result = json.loads(path.read_text())
            else:
                error = f"exit code {proc.returncode}"
            if result is None:
                status = 2
            elif not result["passed"]:
                status = max(status, 1)
            rows.append(_row(rname, result, error))
    table = "\n".join(["| benchmark | ratio | goal | passed |", "|---|---|---|---|", *rows]) + "\n"
    print()
    print(table, end="")
    (RESULTS / "README-table.md").write_text(table)
    return status


if __name__ == "__main__":
    sys.exit(main())
