"""The end of a compose run (`xdc finish`, ground/stop_request.py): stop requests in the launcher's order."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from ground.stop_request import stop_requested
from analysis.learning import learning_words
from xdc.finish import stop_the_rest, wait_for_run_end


def _log(run: Path, process: str, *events: str, **fields: object) -> None:
    (run / "logs").mkdir(parents=True, exist_ok=True)
    with open(run / "logs" / f"{process}.jsonl", "a") as f:
        for e in events:
            f.write(json.dumps({"event": e, "process": process, **fields}) + "\n")


def test_the_run_is_over_when_the_coordinator_completed_and_stopped(tmp_path: Path) -> None:
    _log(tmp_path, "coord", "coordinator_started", "commit", "run_complete")
    late = threading.Timer(0.3, lambda: _log(tmp_path, "coord", "coordinator_stopped", reason="shutdown"))
    late.start()
    t0 = time.monotonic()
    assert wait_for_run_end(tmp_path, timeout_s=10, poll_s=0.05) == "complete"
    assert 0.25 < time.monotonic() - t0 < 5


def test_a_killed_and_restarted_coordinator_is_waited_for_and_a_run_that_never_ends_times_out(tmp_path: Path) -> None:
    # SIGKILLed (no stop logged), restarted by the scenario: still the same run, not over
    _log(tmp_path, "coord", "coordinator_started", "commit", "coordinator_started")
    assert wait_for_run_end(tmp_path, timeout_s=0.3, poll_s=0.05) == "the run did not end within 0 s"


def test_the_rest_stops_in_the_launchers_order_and_a_killed_site_does_not_hold_it_up(tmp_path: Path) -> None:
    _log(tmp_path, "a", "site_started", "site_stopped")  # exited by itself
    _log(tmp_path, "b", "site_started")  # killed by the scenario and never restarted: no stop logged
    _log(tmp_path, "c", "site_started")  # still running: stops on request
    _log(tmp_path, "store", "store_started")
    _log(tmp_path, "telemetry", "sampler_started", "sampler_ready")
    order: list[str] = []

    def process(name: str, stop_event: str) -> None:  # stands in for the process's watcher + handler
        while stop_requested(tmp_path, name) is None:
            time.sleep(0.02)
        order.append(name)
        _log(tmp_path, name, stop_event)

    threads = [threading.Thread(target=process, args=a, daemon=True)
               for a in (("c", "site_stopped"), ("store", "store_stopped"), ("telemetry", "trace_closed"))]
    for t in threads:
        t.start()
    how = stop_the_rest(tmp_path, ["a", "b", "c"], poll_s=0.02, sites_finish_s=0.2, stop_wait_s=1.0, sampler_wait_s=2.0)
    assert order == ["c", "store", "telemetry"]  # sites, then the store, then the sampler (its baseline last)
    assert how == {"a": "exited by itself", "b": "no stop logged (killed, or still running)", "c": "asked to stop",
                   "store": "asked to stop", "telemetry": "asked to stop"}
    assert stop_requested(tmp_path, "coord") is not None  # a coordinator restarted after the end stops at once
    assert stop_requested(tmp_path, "a") is None


def test_the_final_line_reads_the_nll_against_the_runs_own_baselines() -> None:
    b = {"models": {"bigram": {"value": 2.479}, "unigram": {"value": 3.158}}}
    assert learning_words(2.0, b) == \
        "held-out NLL 2.000, 0.48 nats below the bigram baseline (bigram 2.479, unigram 3.158)"
    assert "learned little more than byte frequencies" in learning_words(2.9, b)
    assert "it learned nothing" in learning_words(3.2, b)
    assert learning_words(None, b) == "no held-out NLL was measured"
    assert learning_words(2.0, None) == "held-out NLL 2.000 (no baselines to read it against)"


def test_chaos_takes_a_bare_run_name_as_the_runs_directory(tmp_path: Path, monkeypatch) -> None:
    from xdc.cli import _chaos_run_dir

    monkeypatch.chdir(tmp_path)
    assert _chaos_run_dir("r1") == Path("runs/r1")
    (tmp_path / "r2").mkdir()
    assert _chaos_run_dir("r2") == Path("r2")  # a directory that exists is taken as given
    assert _chaos_run_dir("some/where") == Path("some/where")
