"""The end of a compose run (ground/stop_request.py): a stop request makes a real process stop
through its own SIGTERM handler. `xdc finish`'s order: tests/unit/test_finish.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ground.stop_request import request_path, request_stop, stop_requested

ROOT = Path(__file__).resolve().parents[2]


def test_a_stop_request_makes_a_real_process_stop_through_its_own_sigterm_handler(tmp_path: Path) -> None:
    code = ("import signal, sys, time\n"
            "from ground.stop_request import watch_stop_request\n"
            "signal.signal(signal.SIGTERM, lambda s, f: (print('SIGTERM', flush=True), sys.exit(0)))\n"
            f"watch_stop_request({str(tmp_path)!r}, 'store', poll_s=0.05)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout.readline().strip() == "ready"
        assert stop_requested(tmp_path, "store") is None
        request_stop(tmp_path, "a", "not for the store")  # another process's request is not the store's
        time.sleep(0.3)
        assert p.poll() is None
        request_stop(tmp_path, "store", "the run is over")
        assert p.wait(10) == 0 and p.stdout.read().strip() == "SIGTERM"
    finally:
        if p.poll() is None:
            p.kill()
    assert stop_requested(tmp_path, "store")["reason"] == "the run is over"
    assert not request_path(tmp_path, "store").with_suffix(".tmp").exists()  # written whole, then renamed
