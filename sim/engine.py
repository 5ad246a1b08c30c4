"""The virtual clock: an event heap of (time ns, sequence, action). No sleeping, no threads.

`Clock.at(t_ns, fn, *args)` schedules; `Clock.run(until_ns)` pops in time order (ties in
scheduling order, so a run is deterministic). A function registered with `Clock.batch(fn, many)`
has its consecutive entries of one instant (the ones that would run one after the other) handed
to `many` together, as a list of their argument tuples, in the same order: the coordinator then
steps its core once for a thousand messages of one instant. `SimLog` is the emulator's event writer
(ground/eventlog.EventLog) stamped with the virtual clock instead of the machine's.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import itertools
from pathlib import Path
from typing import Any, Callable, Iterator

from ground.eventlog import EventLog

NS = 1_000_000_000
WALL_BASE_NS = 1_800_000_000 * NS  # the virtual run's wall clock starts here (2027-01-15)
MONO_BASE_NS = 1_000 * NS


# The cyclic collector's first-generation threshold while a simulation runs (Python's default: 700).
# A simulation allocates millions of short-lived, acyclic tuples, dicts and records, so the default
# ran a collection every 700 allocations and spent about a third of a 1,000-site run in them
# (bench/sim_scale: 6.5 -> 4.7 CPU-s for 300 simulated s), while finding a few hundred cycles.
GC_THRESHOLD0 = 100_000


@contextlib.contextmanager
def few_collections() -> Iterator[None]:
    """Collect cyclic garbage every GC_THRESHOLD0 allocations, not 700, for the block's duration."""
    old = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def ns(seconds: float) -> int:
    return int(round(seconds * NS))


class Group(list):  # type: ignore[type-arg]
    """The argument tuples of a run of consecutive entries of one function at one instant, kept as
    one heap entry (see `Clock.at_group`)."""


class Clock:
    def __init__(self) -> None:
        self.now_ns = 0
        self._heap: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events_run = 0
        self._batched: dict[Callable[..., None], Callable[[list[tuple[Any, ...]]], None]] = {}
        # Per instant, the newest entry pushed for it while that entry waits (see `at_group`).
        self._newest: dict[int, tuple[int, int, Callable[..., None], Any]] = {}
        # Suspended owners (a SIGSTOPped process): owner -> (since ns, its entries pulled from the heap,
        # the entries that fell due while it was stopped). See `suspend`.
        self._suspended: dict[int, tuple[Any, int, list[tuple[int, int, Callable[..., None], tuple[Any, ...]]],
                                         list[tuple[Callable[..., None], tuple[Any, ...]]]]] = {}

    @staticmethod
    def _owned(owner: Any, fn: Callable[..., None], args: tuple[Any, ...]) -> bool:
        """An entry belongs to `owner` when it is one of its methods or takes it as first argument."""
        return getattr(fn, "__self__", None) is owner or (bool(args) and args[0] is owner)

    def suspend(self, owner: Any) -> None:
        """Stop `owner` (SIGSTOP): its pending entries wait, and any of its entries that fall due
        while it is stopped (a message to it) wait too, until `resume`."""
        if id(owner) in self._suspended:
            return
        mine = []
        for e in self._heap:
            if type(e[3]) is Group:  # a group's items of this owner come out as entries of their own
                mine += [(e[0], e[1], e[2], a) for a in e[3] if a and a[0] is owner]
                e[3][:] = [a for a in e[3] if not (a and a[0] is owner)]
            elif self._owned(owner, e[2], e[3]):
                mine.append(e)
        # In the order they would have run (time, then scheduling order; a group's items in theirs),
        # not the heap array's, which depends on how the entries were pushed: `resume` reschedules
        # them in this order, and entries of one instant run in the order they were scheduled.
        mine.sort(key=lambda e: (e[0], e[1]))
        if mine:
            self._heap[:] = [e for e in self._heap if type(e[3]) is Group or not self._owned(owner, e[2], e[3])]
            heapq.heapify(self._heap)  # in place: run() holds it
        self._newest.clear()  # (entries left the heap: nothing may join them)
        self._suspended[id(owner)] = (owner, self.now_ns, mine, [])

    def resume(self, owner: Any) -> None:
        """SIGCONT: what fell due while `owner` was stopped runs now, in order; what was pending
        runs later by the time it was stopped (its compute, timers: the process lost that time)."""
        got = self._suspended.pop(id(owner), None)
        if got is None:
            return
        _owner, since, pulled, due = got
        for fn, args in due:
            self.at(self.now_ns, fn, *args)
        stopped = self.now_ns - since
        for t, _seq, fn, args in pulled:
            self.at(t + stopped, fn, *args)

    def _held(self, fn: Callable[..., None], args: tuple[Any, ...]) -> bool:
        for owner, _since, _pulled, due in self._suspended.values():
            if self._owned(owner, fn, args):
                due.append((fn, args))
                return True
        return False

    def batch(self, fn: Callable[..., None], many: Callable[[list[tuple[Any, ...]]], None] | None = None) -> None:
        """Run `many(args_list)` for runs of consecutive same-instant entries of `fn` (see the module doc);
        without `many`, fn once per entry in order (what grouping with `at_group` needs and no more).
        `fn` must be the object scheduled (a bound method kept in an attribute, not a fresh one)."""
        if many is None:
            def many(items: list[tuple[Any, ...]]) -> None:
                for args in items:
                    fn(*args)
        self._batched[fn] = many

    def at(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        t = max(int(t_ns), self.now_ns)
        entry = (t, next(self._seq), fn, args)
        heapq.heappush(self._heap, entry)
        self._newest[t] = entry

    def at_group(self, t_ns: int, fn: Callable[..., None], *args: Any) -> None:
        """As `at(t_ns, fn, *args)` for a `batch`ed fn, without an entry of its own when the newest
        entry of that instant is a group of fn's that has not run: the entries `at` would make would
        come one after the other in that instant (nothing else of it was scheduled between them) and
        be handed to the batch together, so the call joins that group instead (one heap entry for a
        thousand sites' heartbeats or reports). Items whose first argument is a suspended owner are
        held as `at`'s would be (see `suspend`)."""
        t = max(int(t_ns), self.now_ns)
        newest = self._newest.get(t)
        if newest is not None and newest[2] is fn and type(newest[3]) is Group:
            newest[3].append(args)
            return
        entry = (t, next(self._seq), fn, Group([args]))
        heapq.heappush(self._heap, entry)
        self._newest[t] = entry

    def at_group_many(self, t_ns: int, fn: Callable[..., None], many: list[tuple[Any, ...]]) -> None:
        """`at_group(t_ns, fn, *args)` for each args of `many`, in order, with nothing scheduled
        between them: the same group, made in one step."""
        if not many:
            return
        t = max(int(t_ns), self.now_ns)
        newest = self._newest.get(t)
        if newest is not None and newest[2] is fn and type(newest[3]) is Group:
            newest[3].extend(many)
            return
        entry = (t, next(self._seq), fn, Group(many))
        heapq.heappush(self._heap, entry)
        self._newest[t] = entry

    def after(self, delay_s: float, fn: Callable[..., None], *args: Any) -> None:
        self.at(self.now_ns + ns(delay_s), fn, *args)

    def run(self, until_ns: int, stop: Callable[[], bool] = lambda: False) -> None:
        heap, batched, pop = self._heap, self._batched, heapq.heappop
        while heap and not stop():
            entry = heap[0]
            t, _, fn, args = entry
            if t > until_ns:
                break
            pop(heap)
            if self._newest.get(t) is entry:
                del self._newest[t]
            self.now_ns = t
            if type(args) is Group:
                items = [a for a in args if not self._held(fn, a)] if self._suspended else args
                self.events_run += len(args)
                if items:
                    batched[fn](items)
                continue
            self.events_run += 1
            if self._suspended and self._held(fn, args):
                continue
            many = batched.get(fn) if batched else None
            if many is None:
                fn(*args)
                continue
            group = [args]
            while heap and heap[0][0] == t and heap[0][2] is fn and type(heap[0][3]) is not Group:
                e = pop(heap)
                if self._newest.get(t) is e:
                    del self._newest[t]
                group.append(e[3])
            self.events_run += len(group) - 1
            many(group)

    def pending(self) -> int:
        return len(self._heap)


class SimLog(EventLog):
    """One simulated process's log: the same records as the emulator's, on the virtual clock."""

    def __init__(self, path: str | Path, run_id: str, process: str, clock: Clock, pid: int) -> None:
        super().__init__(path, run_id, process)
        self.clock, self.pid = clock, pid

    def _stamp(self, _logger: Any, _method: str, ev: dict[str, Any]) -> dict[str, Any]:
        t = self.clock.now_ns
        head = {"id": f"{self.process}:{next(self._seq)}", "event": ev.pop("event"), "wall_ns": WALL_BASE_NS + t,
                "mono_ns": MONO_BASE_NS + t, "run_id": self.run_id, "process": self.process, "pid": self.pid,
                "epoch": ev.pop("epoch", self.epoch), "step": ev.pop("step", self.step)}
        for k, v in ev.items():
            head.setdefault(k, v)
        return head

    def span_at(self, event: str, start_ns: int, end_ns: int, **fields: Any) -> None:
        """A span that ran from start_ns to end_ns (virtual), logged now."""
        self.emit(event, start_wall_ns=WALL_BASE_NS + start_ns, end_wall_ns=WALL_BASE_NS + end_ns,
                  start_mono_ns=MONO_BASE_NS + start_ns, end_mono_ns=MONO_BASE_NS + end_ns, **fields)


class NullLog:
    """No log (the scale runs): the same calls, nothing written."""

    epoch = 0
    step = 0

    def emit(self, event: str, **fields: Any) -> None:
        pass

    def span_at(self, event: str, start_ns: int, end_ns: int, **fields: Any) -> None:
        pass

    def set_context(self, *, epoch: int | None = None, step: int | None = None) -> None:
        pass

    def close(self) -> None:
        pass
