"""Fault gates: a progress-triggered fault lands at the same point of training in every run.

The chaos driver fires a fault at the first commit at or past its `at_useful_tokens` trigger, but
it sees that commit only when it next reads the coordinator's log (the launcher polls it every
0.25 s), and acts after that. Without a gate the sites had meanwhile taken zero to three inner
steps of the next round: a race of 60-250 ms that moved a run's lost tokens by up to four steps
between repeats of the same scenario and policy, and that no model of the run could predict.

With gates (`recovery.fault_gates`, filled from the scenario like `oracle_faults`), a site whose
round reaches a gate's tokens (the round's samples end at or past it, and began before it: the
commit that fires the fault) waits after reporting that round, before its next inner step, until
the driver has acted: the driver writes RUN/gates/<name> once it has injected every fault that
commit fired. So the fault lands between the triggering round and the next on every site. A gate
already released (a round redone after a rollback) is passed at once; one not released within
`recovery.fault_gate_timeout_ms` is passed anyway (the site logs why). Only injections triggered
by `at_useful_tokens` are gated: `at_s` faults have no training point, and `at_step` and progress
heals are left as they were.

Shared by the driver (chaos/driver.py, which releases), the site (site_agent/rounds.py, which
waits) and the simulator (sim/, which models the wait).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

GATES_DIR = "gates"  # under the run directory
# A waiting site looks for the release, a stop signal and a newer epoch this often: well under the
# sites' spread at a round's end (10-40 ms), so it adds next to nothing to the wait.
POLL_S = 0.002


def gate_name(tokens: int) -> str:
    """The file a gate's release is: one per trigger value (two faults at the same tokens share it)."""
    return f"at_useful_tokens-{int(tokens)}"


def gates_of(faults: Iterable[Any]) -> tuple[int, ...]:
    """The gates of a scenario's faults (chaos.scenario.Fault): the distinct `at_useful_tokens`
    values of their injection triggers, sorted."""
    return tuple(sorted({int(f.trigger.value) for f in faults if f.trigger.key == "at_useful_tokens"}))


def crossed(gates: Iterable[int], tokens_before: int, tokens_after: int) -> list[int]:
    """The gates a round whose samples cover useful tokens (tokens_before, tokens_after] reaches:
    its commit is the first at or past them (commits continue each other's cursors)."""
    return sorted(g for g in gates if tokens_before < g <= tokens_after)


def release(run_dir: Path, tokens: int, **fields: Any) -> bool:
    """Release a gate (atomically: a waiting site sees the whole file or none). False if it was
    released already."""
    d = Path(run_dir) / GATES_DIR
    path = d / gate_name(tokens)
    if path.exists():
        return False
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{gate_name(tokens)}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"tokens": int(tokens), "released_wall_ns": time.time_ns(), **fields}))
    os.replace(tmp, path)
    return True


def is_released(run_dir: Path, tokens: int) -> bool:
    return (Path(run_dir) / GATES_DIR / gate_name(tokens)).exists()


def wait(run_dir: Path, tokens: int, timeout_s: float, leave: Callable[[], bool], *,
         poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> str:
    """Wait until the gate is released. Returns how it ended: "open" (released before we came),
    "released", "left" (`leave()` said to go: a stop signal or a newer epoch, acted on by the
    caller) or "timeout". `poll_s` bounds how late a site sees the release or the signal."""
    if is_released(run_dir, tokens):
        return "open"
    deadline = clock() + timeout_s
    while True:
        if is_released(run_dir, tokens):
            return "released"
        if leave():
            return "left"
        if clock() >= deadline:
            return "timeout"
        sleep(poll_s)
