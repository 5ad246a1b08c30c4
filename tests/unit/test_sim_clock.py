"""The simulator's virtual clock (sim/engine.Clock): grouped entries run as the single entries would."""

from __future__ import annotations

from typing import Any

from sim.engine import Clock


class Owner:
    def __init__(self, name: str) -> None:
        self.name = name


def recorded(build: Any) -> list[tuple[int, str, Any]]:
    """What runs, in order, after `build(clock, fn, other)` schedules it: (time ns, which, argument)."""
    clock, ran = Clock(), []

    def one(x: Any) -> None:
        ran.append((clock.now_ns, "fn", x.name if isinstance(x, Owner) else x))

    def other(x: Any) -> None:
        ran.append((clock.now_ns, "other", x))

    clock.batch(one)  # grouped entries of `one` run one by one, in order
    build(clock, one, other)
    clock.run(10**12)
    return ran


def test_a_bulk_group_runs_as_the_entries_it_stands_for() -> None:
    def single(clock: Clock, fn: Any, other: Any) -> None:
        clock.at(10, other, "before")
        for x in ("a", "b", "c"):
            clock.at_group(10, fn, x)
        clock.at(10, other, "between")
        for x in ("d", "e"):
            clock.at_group(10, fn, x)
        clock.at_group(5, fn, "early")

    def bulk(clock: Clock, fn: Any, other: Any) -> None:
        clock.at(10, other, "before")
        clock.at_group_many(10, fn, [("a",), ("b",)])
        clock.at_group_many(10, fn, [("c",)])  # joins the newest group of that instant
        clock.at(10, other, "between")
        clock.at_group_many(10, fn, [("d",), ("e",)])
        clock.at_group_many(10, fn, [])  # nothing: no entry
        clock.at_group_many(5, fn, [("early",)])

    want = [(5, "fn", "early"), (10, "other", "before"), (10, "fn", "a"), (10, "fn", "b"), (10, "fn", "c"),
            (10, "other", "between"), (10, "fn", "d"), (10, "fn", "e")]
    assert recorded(single) == want
    assert recorded(bulk) == want


def test_a_suspended_owners_items_of_a_bulk_group_wait_for_its_resume() -> None:
    """SIGSTOP of one owner: its item of a group waits; the others run on time."""
    a, b = Owner("a"), Owner("b")

    def build(clock: Clock, fn: Any, other: Any) -> None:
        clock.at_group_many(10, fn, [(a,), (b,)])
        clock.at(5, lambda: clock.suspend(b))  # (not `at(5, clock.suspend, b)`: an entry taking b is b's)
        clock.at(20, lambda: clock.resume(b))

    assert recorded(build) == [(10, "fn", "a"), (25, "fn", "b")]  # pending when stopped: runs 15 ns late


def test_a_suspended_owners_entries_of_one_instant_run_after_resume_in_the_order_they_were_scheduled() -> None:
    """Resume reschedules what suspend pulled from the heap in run order (time, then scheduling
    order), not in the heap array's order, which depends on how the entries were pushed."""
    b = Owner("b")
    ran: list[tuple[int, str]] = []
    clock = Clock()

    def mark(_owner: Owner, label: str) -> None:  # b's entry (b is its first argument)
        ran.append((clock.now_ns, label))

    for i in range(8):
        clock.at(10, mark, b, f"b{i}")
        clock.at(10 - i % 3, ran.append, (0, "other"))  # others' entries between b's reorder the heap array
    clock.at(5, lambda: clock.suspend(b))
    clock.at(20, lambda: clock.resume(b))
    clock.run(10**12)
    assert [x for x in ran if x[1] != "other"] == [(25, f"b{i}") for i in range(8)]
