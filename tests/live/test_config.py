"""`xdc config` as a real process: the partial-link note on stderr, and a closed pipe exits quietly.
The typed run configuration itself (ground/config.py): tests/unit/test_config.py."""

from __future__ import annotations

import json
from pathlib import Path


# ---------------------------------------------------------------- the command line


def test_xdc_config_into_a_closed_pipe_exits_quietly() -> None:
    """`xdc config | head`: the reader is gone before xdc writes; no BrokenPipe traceback."""
    import os
    import subprocess
    import sys

    r, w = os.pipe()
    os.close(r)  # the reader has already gone: every write gets EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "xdc.cli", "config"], stdout=w, stderr=subprocess.PIPE,
                           timeout=60, cwd=Path(__file__).resolve().parents[2])
    finally:
        os.close(w)
    assert p.stderr.decode() == ""
    assert p.returncode == 141  # 128 + SIGPIPE, as a shell reports a filter killed by the pipe


def test_xdc_config_shows_the_partial_link_note_on_stderr_and_the_config_on_stdout() -> None:
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "xdc.cli", "config", "--set", "wan.site_link.up.bandwidth_kbps=1250"],
                       capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0 and json.loads(p.stdout)["wan"]["site_link"]["up"] == {
        "latency_ms": 0, "jitter_ms": 0, "bandwidth_kbps": 1250}
    assert p.stderr.count("config note: wan.site_link.") == 2 and "latency_ms=0" in p.stderr
