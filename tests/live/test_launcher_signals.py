"""SIGTERM to a live `xdc run`: every process it started stops, none is orphaned, the summary says so."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.conftest import events


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_mid_run_stops_every_process_without_orphans(background_run):
    run = background_run(["train.mode=local", "train.target_useful_tokens=1000000", "train.threads_per_site=1",
                          "train.device=cpu"])
    run.wait_for_event("a", "compute", timeout_s=180)
    run_dir = run.run_dir
    pids = {e["name"]: e["child_pid"] for e in events(run_dir, "launcher") if e["event"] == "process_started"}
    assert os.getpid() not in pids.values() and run.proc.pid not in pids.values()
    # `xdc run` forks its sites from a fork server (xdc.cli.RECIPE): it is stopped with the rest
    assert set(pids) == {"toxiproxy", "telemetry", "coord", "store", "forkserver", "a", "b", "c"}
    run.proc.send_signal(signal.SIGTERM)
    rc = run.proc.wait(60)
    assert rc != 0  # an interrupted run is not a successful one
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids.values()):
        time.sleep(0.2)
    assert not [n for n, p in pids.items() if _alive(p)], "orphaned processes"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["clean_exit"] is False
    assert summary["work_balanced"]
    # Each process recorded why it stopped.
    for site in ("a", "b", "c"):
        stops = [e for e in events(run_dir, site) if e["event"] == "site_stopped"]
        assert stops and stops[-1]["reason"] == "signal"


def test_a_run_stopped_by_the_launchers_timeout_is_not_a_clean_exit(tmp_path):
    """Every process exits 0 on the launcher's SIGTERM, yet the run did not end by itself (a soak
    run stuck for 900 s once summarised as clean): summary.json says timed_out and clean_exit False."""
    from ground.config import load_config
    from cluster.launcher import launch

    cfg = load_config({"runs_dir": str(tmp_path), "train": {"target_useful_tokens": 10_000_000, "threads_per_site": 1,
                                                             "device": "cpu"}})
    run_dir, s = launch(cfg, quiet=True, timeout_s=8)
    assert s["timed_out"] is True and s["clean_exit"] is False, {k: s[k] for k in ("exit_codes", "timed_out")}
    finished = [e for e in events(run_dir, "launcher") if e["event"] == "run_finished"]
    assert finished and finished[-1]["timed_out"] is True
