"""The human lines of a run (ground/narrate.py) from a real process: with XDC_NARRATE it prints the
line and still logs the JSON. The lines themselves: tests/unit/test_narration.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


def test_a_process_with_XDC_NARRATE_prints_the_line_and_still_logs_the_json(tmp_path: Path) -> None:
    code = ("from ground.eventlog import EventLog\n"
            f"log = EventLog({str(tmp_path / 'coord.jsonl')!r}, 'r1', 'coord')\n"
            "log.emit('site_failed', site='b', reason='no heartbeat')\n"
            "log.emit('heartbeat_stats', n=3)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "XDC_NARRATE": "1", "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert line.endswith(" site b failed: no heartbeat"), line
    assert len((tmp_path / "coord.jsonl").read_text().splitlines()) == 2  # the record is whole
    quiet = subprocess.run([sys.executable, "-c", code.replace("coord.jsonl", "c2.jsonl")], cwd=ROOT,
                           capture_output=True, text=True, timeout=60,
                           env={**{k: v for k, v in os.environ.items() if k != "XDC_NARRATE"}, "PYTHONPATH": str(ROOT)})
    assert quiet.returncode == 0 and quiet.stdout == ""  # natively the processes print nothing
