"""A process reports its own peak RSS, not its parent's (ground/resources.py): a child started by fork
and exec from a parent that holds 300 MiB (the launcher under pytest holds torch) must not report
those 300 MiB, which getrusage's ru_maxrss carries across exec on Linux."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ground.resources import peak_rss_mib

ROOT = Path(__file__).resolve().parents[2]


def test_a_child_started_by_fork_and_exec_reports_its_own_peak_not_its_parents() -> None:
    held = bytearray(300 * 1024 * 1024)  # touched: resident in this process
    held[::4096] = b"\x01" * len(held[::4096])
    assert peak_rss_mib() > 300
    out = subprocess.run([sys.executable, "-c", "from ground.resources import peak_rss_mib; print(peak_rss_mib())"],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         preexec_fn=lambda: None)  # (a preexec_fn makes subprocess fork, as the launcher does)
    child = float(out.stdout)
    assert 5 < child < 150, child
    del held
