"""What a new user waits for: `make demo` (or `make test`) on a fresh clone, setup included.

`python -m bench.fresh_clone [demo|test]` clones this repository's HEAD into a temporary directory
(`git clone --no-hardlinks`: nothing of this checkout's `.venv/` or `runs/` comes along), runs the
target there with the real network installs (`make setup`: a venv, the package and its
dependencies from PyPI, the Toxiproxy binary reused from PATH when present), and times it with
`/usr/bin/time -v` (peak RSS of the largest single process). Goals (issue 55): `make demo` within
5 minutes, `make test` within 20 minutes, on 2 cores. The result files are `fresh_clone_demo` and
`fresh_clone_test`; each records the commit, whether this checkout was dirty (the clone takes
HEAD, never the uncommitted changes), and the command's exit status (a failed run is not a pass).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, env_info, write_result

GOALS_S = {"demo": 300.0, "test": 1200.0}


def run(target: str) -> int:
    with tempfile.TemporaryDirectory(prefix=f"xdc-fresh-{target}-") as tmp:
        clone = Path(tmp) / "xdc"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        log = Path(tmp) / "time.txt"
        t0 = time.monotonic()
        proc = subprocess.run(["/usr/bin/time", "-v", "-o", str(log), "make", target], cwd=clone,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.monotonic() - t0
        tail = proc.stdout[-4000:]
        timing = log.read_text() if log.exists() else ""
    peak_kib = re.search(r"Maximum resident set size \(kbytes\): (\d+)", timing)
    goal = GOALS_S[target]
    ok = proc.returncode == 0 and wall <= goal
    write_result(f"fresh_clone_{target}", ratio=wall / goal, goal=f"wall / {goal:.0f} s <= 1 (and exit 0)", passed=ok,
                 reference="fixed_goal", measures=["."],
                 raw={"wall_s": wall, "returncode": proc.returncode, "peak_rss_mib_largest_process":
                      int(peak_kib.group(1)) / 1024 if peak_kib else None, "output_tail": tail,
                      "loadavg_1m_at_end": os.getloadavg()[0]},
                 env=env_info("v2.12.0"),
                 notes=f"`make {target}` on a fresh clone of HEAD, setup included (venv, PyPI installs), on "
                       f"{os.cpu_count()} cores: {wall:.0f} s wall, exit {proc.returncode}, goal {goal:.0f} s.")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["demo"]
    if args[0] not in GOALS_S:
        print(f"usage: python -m bench.fresh_clone [{'|'.join(GOALS_S)}]", file=sys.stderr)
        return 2
    return run(args[0])


if __name__ == "__main__":
    sys.exit(main())
