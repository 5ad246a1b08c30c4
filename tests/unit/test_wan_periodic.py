"""The I/O thread's periodic tasks (wan/periodic.py) on a virtual clock."""

from __future__ import annotations

from wan.periodic import Periodic


def test_tasks_run_at_once_then_every_interval_and_at_once_again_after_a_reconnect():
    p = Periodic()
    ran: list[str] = []
    p.add(0.5, lambda: ran.append("hb"))
    p.add(2.0, lambda: ran.append("slow"))
    for fn in p.due(100.0):
        fn()
    assert ran == ["hb", "slow"]  # never run: due at once
    assert p.due(100.4) == [] and p.sleep_ms(100.4) == 51  # 100 ms until the heartbeat: at most 50 ms
    assert len(p.due(100.5)) == 1
    p.run_all_next()
    assert len(p.due(100.6)) == 2  # a reconnect: both at once


def test_the_loop_sleeps_until_the_next_task_and_at_most_50_ms():
    assert Periodic().sleep_ms(0.0) == 51
    p = Periodic()
    p.add(0.03125, lambda: None)  # 1/32 s: exact in binary, so the arithmetic below is too
    p.due(1.0)
    assert p.sleep_ms(1.0) == 32  # 31.25 ms until it is due again, whole ms + 1
