"""Run the benchmarks (all, or the named ones) and print a markdown table of their ratios.

    python -m bench.run_all                      # all of them (`make bench`)
    python -m bench.run_all wan_fidelity ...     # only these
    python -m bench.run_all --table              # no run: rebuild the table (and README's) from the files

Each benchmark runs in its own Python process (so torch thread settings, sockets and Toxiproxy of
one cannot leak into the next) and writes bench/results/<name>.json. The table is built from the result
files (never typed by hand), printed, written to bench/results/README-table.md and between the
markers of README.md's performance section. A result is marked stale when a commit after the one
it was measured at touched the code it measures (its `measures` paths), or it records neither. Exit status: 0 if every benchmark ran and met its goal,
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

BENCHMARKS = ["wan_fidelity", "collective_efficiency", "collective_unshaped", "emulator_ceiling", "emulator_overhead",
              "cluster_throughput", "heartbeat_under_load", "recovery", "cluster_startup", "recovery_torchft", "insider_flood", "storm_goodput", "fresh_clone",
              "analysis_speed", "sim_scale", "sim_validate", "adaptive_collapse"]
# A benchmark module that writes more than one result file.
RESULT_NAMES = {"recovery": ["recovery_failover", "recovery_rejoin"],
                "cluster_startup": ["cluster_startup", "cluster_rejoin_forked"],
                # `make bench` times `make demo` on a fresh clone; `python -m bench.fresh_clone test` (20+ minutes)
                # is run by itself.
                "fresh_clone": ["fresh_clone_demo"]}


README = ROOT / "README.md"
TABLE_START, TABLE_END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)


def staleness(result: dict) -> str | None:
    """Why this result no longer describes the code at HEAD, or None if it still does."""
    commit = (result.get("env") or {}).get("git_commit")
    measures = result.get("measures")
    if not commit:
        return "no commit recorded"
    dirty = (result.get("env") or {}).get("dirty_measured")
    if dirty:
        return f"measured with uncommitted changes to {', '.join(dirty[:4])}"
    if not measures:
        return "the code it measures is not recorded (an older result format)"
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return f"commit {commit[:10]} is not in this repository"
    changed = _git("log", "--format=%h", f"{commit}..HEAD", "--", *measures).stdout.split()
    if changed:
        return f"{len(changed)} later commit(s) touch {', '.join(measures)}"
    return None


def _row(name: str, result: dict | None, error: str | None) -> str:
    if result is None:
        return f"| {name} | ERROR | - | - | - | no result ({error}) |"
    stale = staleness(result)
    commit = ((result.get("env") or {}).get("git_commit") or "?")[:10]
    state = f"**stale**: {stale}" if stale else "current"
    return (f"| {name} | {result['ratio']:.4f} | {result['goal']} | {'yes' if result['passed'] else 'NO'} | "
            f"{result.get('reference', 'unrecorded')} | {commit} ({state}) |")


def table(names: list[str]) -> str:
    rows = []
    for name in names:
        for rname in RESULT_NAMES.get(name, [name]):
            path = RESULTS / f"{rname}.json"
            result = json.loads(path.read_text()) if path.exists() else None
            rows.append(_row(rname, result, None if result else "never run"))
    head = ["| benchmark | ratio | goal | passed | reference | measured at |", "|---|---|---|---|---|---|"]
    return "\n".join([*head, *rows]) + "\n"


def write_table(text: str) -> None:
    (RESULTS / "README-table.md").write_text(text)
    readme = README.read_text()
    if TABLE_START in readme and TABLE_END in readme:
        pre, rest = readme.split(TABLE_START, 1)
        _old, post = rest.split(TABLE_END, 1)
        README.write_text(f"{pre}{TABLE_START}\n{text}{TABLE_END}{post}")


def main(argv: list[str] | None = None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    if args == ["--table"]:
        text = table(BENCHMARKS)
        print(text, end="")
        write_table(text)
        return 0
    names = args or BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {BENCHMARKS}", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
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
                print(f"== {rname}: no result ({error})", flush=True)
            elif not result["passed"]:
                status = max(status, 1)
    text = table(BENCHMARKS)  # every benchmark's latest file, each with its commit and staleness
    print()
    print(text, end="")
    write_table(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
