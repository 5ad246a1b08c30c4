"""The leader's background uploads: one job at a time, in the order started, and a job's failure
is raised where the round loop waits for it (as the inline upload would have raised it)."""

from __future__ import annotations

import threading
import time

import pytest

from site_agent.background import OneAtATime


def test_jobs_run_one_at_a_time_in_order_and_a_failure_is_raised_at_wait():
    jobs = OneAtATime("t")
    log: list[str] = []
    running = threading.Semaphore(1)

    def job(name: str, fail: bool = False):
        def run() -> None:
            assert running.acquire(blocking=False), "two jobs overlapped"
            try:
                log.append(f"{name}+")
                time.sleep(0.05)
                log.append(f"{name}-")
                if fail:
                    raise RuntimeError(f"{name} failed")
            finally:
                running.release()
        return run

    jobs.start(job("a"))
    jobs.start(job("b"))  # waits for a
    assert jobs.busy()
    jobs.wait()
    assert log == ["a+", "a-", "b+", "b-"] and not jobs.busy()
    jobs.start(job("c", fail=True))
    with pytest.raises(RuntimeError, match="c failed"):
        jobs.wait()
    jobs.wait()  # raised once; nothing in flight now
    jobs.start(job("d", fail=True))
    with pytest.raises(RuntimeError, match="d failed"):
        jobs.start(job("e"))  # the next start waits for d and raises its failure; e does not run
    assert "e+" not in log
