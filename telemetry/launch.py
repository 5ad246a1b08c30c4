"""The launcher's hook for the sampler: one more process, started first and stopped last.

`start(launcher)` spawns `telemetry.sampler` through the launcher's own `_spawn` (so it is in its
process table, with its log and its parent-death signal) and waits until the sampler logs
`sampler_ready` (its idle baseline before the run is done). A sampler that does not get ready is
logged and the run goes on without it: telemetry never stops a run. `stop(launcher)` runs after every
other process has stopped: SIGTERM starts the sampler's idle baseline after the run; it then closes
its trace and exits.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

from telemetry.sampler import PROCESS_NAME
from ground.eventlog import LogTail

READY_GRACE_S = 20.0  # start-up (imports, NVML init) on a loaded machine, beyond the baseline itself


def start(ln: Any) -> None:
    cfg = ln.cfg.telemetry
    if not cfg.enabled:
        return
    ln._spawn(PROCESS_NAME, "telemetry.sampler")
    tail = LogTail(ln.run_dir / "logs" / f"{PROCESS_NAME}.jsonl")
    deadline = time.monotonic() + cfg.idle_baseline_s + READY_GRACE_S
    proc = ln.procs[PROCESS_NAME]
    while time.monotonic() < deadline and not ln.interrupted:
        if any(e.get("event") == "sampler_ready" for e in tail.read()):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    if ln.log is not None:
        ln.log.emit("sampler_not_ready", exit_code=proc.poll(), waited_s=cfg.idle_baseline_s + READY_GRACE_S,
                    interrupted=ln.interrupted)


def stop(ln: Any) -> None:
    proc = ln.procs.get(PROCESS_NAME)
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(ln.cfg.telemetry.idle_baseline_s + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    ln.exit_codes[PROCESS_NAME] = proc.returncode
