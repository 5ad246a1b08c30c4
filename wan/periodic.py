"""The periodic tasks of a node's I/O thread (heartbeats), on the caller's clock: which are due, how
long the loop may sleep until the next one, and "run every task at once" after a reconnect (the
peer hears at once that we are alive)."""

from __future__ import annotations

from typing import Callable

MAX_SLEEP_MS = 50.0  # the I/O loop polls at least this often (ms)


class Periodic:
    def __init__(self) -> None:
        # (interval s, task, the monotonic s it last ran); a task that never ran is due at once
        self._tasks: list[tuple[float, Callable[[], None], list[float]]] = []

    def add(self, interval_s: float, fn: Callable[[], None]) -> None:
        self._tasks.append((interval_s, fn, [0.0]))

    def due(self, now_s: float) -> list[Callable[[], None]]:
        """The tasks due at `now_s`, in the order added; each is marked as run now."""
        out = []
        for interval, fn, last in self._tasks:
            if now_s - last[0] >= interval:
                last[0] = now_s
                out.append(fn)
        return out

    def sleep_ms(self, now_s: float) -> int:
        """How long the loop may wait for messages before the next task is due (ms, at least 1)."""
        t = MAX_SLEEP_MS
        for interval, _fn, last in self._tasks:
            t = min(t, max(0.0, (last[0] + interval - now_s) * 1000))
        return int(t) + 1

    def run_all_next(self) -> None:
        """Every task is due at the next check."""
        for _interval, _fn, last in self._tasks:
            last[0] = 0.0
