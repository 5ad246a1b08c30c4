"""`xdc finish`: the end of a compose run, as the native launcher ends a run of its own processes.

The `finish` service starts with the cluster and waits. When the coordinator has finished the run
(its log says so), the sites get `SITES_FINISH_S` to exit by themselves; then whatever still runs is
asked to stop through the run directory (ground/stop_request.py), in the process table's stop
order (sites, coordinator, store, then the energy sampler, whose idle baseline comes last). Then it
reads Toxiproxy's byte counters into the history, writes `summary.json`, the artifact and the
report, and prints where they are on the host and what to run next. Every attached service has then
exited, so `docker compose up` returns by itself.

It reads only the logs (and Toxiproxy's API), as the analysis does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from analysis.learning import learning_words
from ground.eventlog import LogTail
from ground.processes import COORD, STORE, TELEMETRY
from ground.stop_request import request_stop

SITES_FINISH_S = 30.0  # as the launcher: after the coordinator finished, how long the sites may take
STOP_WAIT_S = 20.0  # after a stop request, how long a process may take to log its stop
RESTART_WAIT_S = 30.0  # a coordinator that stopped before completing: how long a restart may take


@dataclass
class Lifecycle:
    """What one process's log says of it: started (and how often), stopped after its last start."""

    tail: LogTail
    start_event: str
    stop_events: tuple[str, ...]
    starts: int = 0
    stopped: bool = False
    last_stop: dict[str, Any] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def update(self) -> "Lifecycle":
        for ev in self.tail.read():
            name = ev.get("event")
            self.seen.add(str(name))
            if name == self.start_event:
                self.starts += 1
                self.stopped = False
            elif name in self.stop_events:
                self.stopped = True
                self.last_stop = ev
        return self


def _wait(cond: Callable[[], bool], timeout_s: float, poll_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(poll_s)
    return True


def wait_for_run_end(run_dir: Path, *, timeout_s: float, poll_s: float = 0.5) -> str:
    """Block until the coordinator has finished the run; returns the outcome in words.

    "complete" once it logged `run_complete` and stopped; otherwise why it is over (stopped before
    completing and not restarted within RESTART_WAIT_S, or `timeout_s` passed).
    """
    coord = Lifecycle(LogTail(run_dir / "logs" / f"{COORD}.jsonl"), "coordinator_started", ("coordinator_stopped",))
    end = time.monotonic() + timeout_s
    stopped_at: float | None = None
    while time.monotonic() < end:
        coord.update()
        if coord.stopped:
            if "run_complete" in coord.seen:
                return "complete"
            stopped_at = stopped_at or time.monotonic()
            if time.monotonic() - stopped_at > RESTART_WAIT_S:
                return f"the coordinator stopped before the run completed ({coord.last_stop.get('reason')})"
        else:
            stopped_at = None
        time.sleep(poll_s)
    return f"the run did not end within {timeout_s:.0f} s"


def stop_the_rest(run_dir: Path, sites: list[str], *, poll_s: float = 0.5, sites_finish_s: float = SITES_FINISH_S,
                  stop_wait_s: float = STOP_WAIT_S, sampler_wait_s: float = 60.0) -> dict[str, str]:
    """The launcher's stop order through stop requests; returns, per process, how it ended."""
    logs = run_dir / "logs"
    life = {s: Lifecycle(LogTail(logs / f"{s}.jsonl"), "site_started", ("site_stopped",)) for s in sites}
    life[STORE] = Lifecycle(LogTail(logs / f"{STORE}.jsonl"), "store_started", ("store_stopped",))
    life[TELEMETRY] = Lifecycle(LogTail(logs / f"{TELEMETRY}.jsonl"), "sampler_started", ("trace_closed",))
    how: dict[str, str] = {}

    def done(names: list[str]) -> bool:
        return all(life[n].update().stopped for n in names)

    _wait(lambda: done(sites), sites_finish_s, poll_s)
    for group, wait_s in ((sites, stop_wait_s), ([STORE], stop_wait_s), ([TELEMETRY], sampler_wait_s)):
        for n in group:
            if life[n].update().stopped:
                how[n] = "exited by itself" if n in sites else how.get(n, "stopped")
                continue
            request_stop(run_dir, n, "the run is over")
            how[n] = "asked to stop"
        _wait(lambda: done(group), wait_s, poll_s)
        for n in group:
            if not life[n].update().stopped:
                # A process killed by the scenario and never restarted logs no stop: nothing runs there.
                how[n] = "no stop logged (killed, or still running)"
    request_stop(run_dir, COORD, "the run is over")  # a coordinator restarted after the end stops at once
    return how


def summarize_with_counters(run_dir: Path, toxiproxy_api: str | None) -> dict[str, Any]:
    """Toxiproxy's per-proxy byte totals into the history (`summarize.jsonl`), then RUN/summary.json."""
    from analysis.summary import summarize
    from ground.eventlog import EventLog
    from wan.toxiproxy import ToxiproxyClient, ToxiproxyError

    proxy_bytes: dict[str, Any] = {}
    if toxiproxy_api:
        host, _, port = toxiproxy_api.rpartition(":")
        try:
            proxy_bytes = ToxiproxyClient(host, int(port), timeout_s=10.0).proxy_bytes()
        except (ToxiproxyError, OSError, ValueError) as e:
            proxy_bytes = {"error": f"{type(e).__name__}: {e}"}
        run_id = json.loads((run_dir / "config.json").read_text()).get("run_id", run_dir.name)
        slog = EventLog(run_dir / "logs" / "summarize.jsonl", run_id, "summarize")
        slog.emit("proxy_counters", proxies=proxy_bytes, source="toxiproxy /metrics toxiproxy_proxy_received_bytes_total")
        slog.close()
    summary = summarize(run_dir, proxy_bytes=proxy_bytes, exit_codes={}, interrupted=False)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    return summary


def finish(run_dir: Path, *, toxiproxy_api: str | None, host_runs_dir: str | None, timeout_s: float,
           poll_s: float = 0.5, out: Callable[[str], None] = print) -> int:
    from analysis.analyze import analyze
    from ground.config import config_from_json

    cfg = config_from_json(run_dir / "config.json")
    sites = list(cfg.cluster.sites)
    outcome = wait_for_run_end(run_dir, timeout_s=timeout_s, poll_s=poll_s)
    out(f"the coordinator is done: {outcome}; ending the run (the sites have {SITES_FINISH_S:.0f} s to exit)")
    how = stop_the_rest(run_dir, sites, poll_s=poll_s)
    out("processes: " + ", ".join(f"{p} {h}" for p, h in how.items()))
    summary = summarize_with_counters(run_dir, toxiproxy_api)
    res = analyze([run_dir], run_dir, report=True)
    checks = {c["name"]: c["status"] for c in res.artifact["checks"]}
    failed = sorted(n for n, s in checks.items() if s == "fail")
    host = f"{host_runs_dir.rstrip('/')}/{run_dir.name}" if host_runs_dir else str(run_dir)
    out(f"run {run_dir.name} {outcome}: {summary.get('useful_tokens', 0):,} useful tokens; "
        f"{learning_words(summary.get('final_heldout_nll'), summary.get('baselines'))}")
    out(f"checks: {sum(s == 'pass' for s in checks.values())} pass, {len(failed)} fail"
        + (f" ({', '.join(failed)})" if failed else "")
        + f", {sum(s == 'unknown' for s in checks.values())} unknown")
    out(f"logs:   {host}/logs (one JSON-lines file per process)")
    out(f"report: {host}/report/index.html (open it in a browser)")
    out("next:   docker compose down --volumes (removes the project's containers and networks; "
        "the run directory stays)")
    return 0 if outcome == "complete" and not failed else 1
