"""A stop request through the run directory: SIGTERM for a process nobody can signal.

The native launcher stops its processes with SIGTERM. Under compose no service may signal another
(each has its own namespace; nothing holds the Docker socket), so the end of a compose run
(`xdc finish`) asks a process to stop by writing `RUN/stop/<process>.json`; the process, which
watches for its own request, then sends itself SIGTERM and ends exactly as it would under the
launcher (a site its last counters, the store its fence, the sampler its idle baseline and trace).

`request_stop` is atomic (write, then rename): a watcher never reads half a request.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

STOP_DIR = "stop"


def request_path(run_dir: str | Path, process: str) -> Path:
    return Path(run_dir) / STOP_DIR / f"{process}.json"


def request_stop(run_dir: str | Path, process: str, reason: str) -> Path:
    """Ask `process` of the run to stop (it SIGTERMs itself within its poll period)."""
    path = request_path(run_dir, process)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"process": process, "reason": reason, "wall_ns": time.time_ns()}))
    os.replace(tmp, path)
    return path


def stop_requested(run_dir: str | Path, process: str) -> dict | None:
    """The request for `process`, or None."""
    try:
        return json.loads(request_path(run_dir, process).read_text())
    except FileNotFoundError:
        return None


def watch_stop_request(run_dir: str | Path, process: str, poll_s: float = 0.5,
                       signum: int = signal.SIGTERM) -> threading.Thread:
    """A daemon thread that sends this process `signum` once a stop request for `process` exists.

    A request already there when the process starts (a site restarted after the run ended) stops
    it at once. The signal goes to this process's own handler, so the stop is the ordinary one.
    """
    def _watch() -> None:
        while stop_requested(run_dir, process) is None:
            time.sleep(poll_s)
        os.kill(os.getpid(), signum)

    t = threading.Thread(target=_watch, name=f"stop-request-{process}", daemon=True)
    t.start()
    return t
