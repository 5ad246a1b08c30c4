"""The chaos driver: runs a scenario against a live cluster, on an injected clock.

    driver = ChaosDriver(scenario, handle, run_dir)       # clock=time.monotonic by default
    driver.run(until=lambda: launcher_done)                # poll every 0.1 s; heal_all() at the end
  or, inside another loop (the launcher's):
    driver.poll()  ...  driver.heal_all(); driver.finish()

It follows the run by tailing RUN/logs/coord.jsonl: the first `membership_epoch` starts the
scenario clock (`at_s` counts from the moment the driver saw it, so within one poll of it), and
`commit` events carry `step` and `useful_tokens` for the progress triggers. After every commit it
reads, it checks the progress triggers, so a fault fires at the first commit that meets its
threshold (named in the event's `fired_by`) even when several commits are read at once. Once every
fault at an `at_useful_tokens` value is injected it releases that value's fault gate
(ground/gates.py: the sites of a run configured with gates wait there, so the fault lands at the
same point of training in every run), logged `fault_gate_released`; `finish` releases them all.

Within one step the order is fixed: due heals (in fault order), follow-ups (`tick`), then due
injections (in fault order). Events, to the handle's log (RUN/logs/chaos.jsonl, process "chaos"):
`scenario_started`, `fault_injected`, `fault_followup`, `fault_healed`, `fault_failed` (an
inject or heal raised: the error is logged and the driver carries on; a failed heal is tried
again every HEAL_RETRY_S, its `fault_healed` then has reason "retry"), `scenario_finished`.
Each fault event has `fault` (index), `kind`, `target`, `result` (what the nemesis returned),
`t_s` (scenario seconds), the progress, and the real wall/monotonic ns bounds of the action
(`start_wall_ns` .. `end_mono_ns`) besides the log's own `wall_ns`/`mono_ns` stamps.
"""

from __future__ import annotations

import argparse
import json
import signal as _signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from chaos.handle import ClusterHandle, EventSink
from chaos.nemesis import Nemesis, nemesis_for
from chaos.scenario import Fault, Scenario, Trigger
from ground.eventlog import LogTail
from ground import gates
from ground.faults import takes_down
from ground.gates import gates_of

PENDING, ACTIVE, HEALED, FAILED, HEAL_FAILED = "pending", "active", "healed", "failed", "heal_failed"
HEAL_RETRY_S = 2.0  # a heal that failed (e.g. Toxiproxy's API stalled flushing a toxic) is tried again this often


@dataclass
class FaultState:
    index: int
    fault: Fault
    nemesis: Nemesis
    status: str = PENDING
    injected_at: float | None = None  # driver clock
    healed_at: float | None = None
    heal_failed_at: float | None = None  # the last failed heal (retried HEAL_RETRY_S later)


class ChaosDriver:
    def __init__(self, scenario: Scenario, handle: ClusterHandle, run_dir: str | Path,
                 clock: Callable[[], float] = time.monotonic, *, log: EventSink | None = None,
                 noop: bool = False, nemesis_factory: Callable[..., Nemesis] = nemesis_for) -> None:
        self.scenario = scenario
        self.handle = handle
        self.run_dir = Path(run_dir)
        self.clock = clock
        self.log: EventSink = log if log is not None else handle.log
        self.noop = noop
        self.states = [FaultState(i, f, nemesis_factory(f, i, noop=noop)) for i, f in enumerate(scenario.faults)]
        self.tail = LogTail(self.run_dir / "logs" / "coord.jsonl")
        self.t0: float | None = None
        self.epoch = 0
        self.step = 0
        self.useful_tokens = 0
        self.last_commit: dict[str, Any] | None = None
        self._down: set[str] = set()
        self._released: set[int] = set()  # fault gates released (ground/gates.py)
        self._emitted: list[dict[str, Any]] = []
        self._finished = False

    # ------------------------------------------------------------------ state

    @property
    def started(self) -> bool:
        return self.t0 is not None

    @property
    def done(self) -> bool:
        """Nothing left to do before the end of the run: no fault pending, none due to heal
        (faults without a healing point stay injected until heal_all)."""
        return all(s.status in (HEALED, FAILED) or (s.status == ACTIVE and s.fault.permanent) for s in self.states)

    def taken_down(self) -> set[str]:
        """Processes a fault killed (or preempted) and nobody started again yet: their exit is the
        scenario's doing, not a failure of the run."""
        return set(self._down)

    def progress(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "step": self.step, "useful_tokens": self.useful_tokens}

    # ------------------------------------------------------------------ events

    def _emit(self, event: str, **fields: Any) -> None:
        rec = {"event": event, **fields}
        self._emitted.append(rec)
        self.log.emit(event, **fields)

    def _fault_fields(self, st: FaultState, now: float) -> dict[str, Any]:
        return {"scenario": self.scenario.name, "fault": st.index, "kind": st.fault.kind, "target": st.fault.target,
                "t_s": round(now - self.t0, 6) if self.t0 is not None else None, "clock_s": now,
                "progress": self.progress()}

    def _act(self, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any] | None, str | None, dict[str, int]]:
        w0, m0 = time.time_ns(), time.monotonic_ns()
        try:
            result, error = fn(), None
        except Exception as e:  # a nemesis failing is an event, never the end of the scenario
            result, error = None, f"{type(e).__name__}: {e}"
        bounds = {"start_wall_ns": w0, "end_wall_ns": time.time_ns(),
                  "start_mono_ns": m0, "end_mono_ns": time.monotonic_ns()}
        return result, error, bounds

    # ------------------------------------------------------------------ the loop

    def poll(self) -> list[dict[str, Any]]:
        """One step: read new coordinator events, then heal / follow up / inject what is due.
        Returns the events emitted during this step."""
        self._emitted = []
        for ev in self.tail.read():
            name = ev.get("event")
            if name == "membership_epoch":
                if isinstance(ev.get("epoch"), int):
                    self.epoch = ev["epoch"]
                    self.log.set_context(epoch=self.epoch)
                if self.t0 is None:
                    self.t0 = self.clock()
                    self._emit("scenario_started", scenario=self.scenario.name, seed=self.scenario.seed,
                               description=self.scenario.description, n_faults=len(self.states),
                               faults=[f.to_dict() for f in self.scenario.faults], noop=self.noop,
                               clock_s=self.t0, started_by={"id": ev.get("id"), "mono_ns": ev.get("mono_ns"),
                                                            "members": ev.get("members")})
                self._advance(None)
            elif name == "commit":
                if isinstance(ev.get("step"), int):
                    self.step = max(self.step, ev["step"])
                if isinstance(ev.get("useful_tokens"), int):
                    self.useful_tokens = max(self.useful_tokens, ev["useful_tokens"])
                if isinstance(ev.get("epoch"), int):
                    self.epoch = ev["epoch"]
                self.log.set_context(epoch=self.epoch, step=self.step)
                self.last_commit = {"id": ev.get("id"), "commit_id": ev.get("commit_id"), "step": ev.get("step"),
                                    "useful_tokens": ev.get("useful_tokens")}
                self._advance(self.last_commit)
        self._advance(None)
        return list(self._emitted)

    def run(self, until: Callable[[], bool], *, interval_s: float = 0.1,
            sleep: Callable[[float], None] = time.sleep) -> None:
        """poll() every interval_s until `until()` is true; then heal_all() and finish()."""
        try:
            while not until():
                self.poll()
                sleep(interval_s)
            self.poll()
        finally:
            self.heal_all()
            self.finish()

    def _met(self, trig: Trigger, now: float) -> bool:
        if trig.key == "at_s":
            return self.t0 is not None and now - self.t0 >= trig.value
        if trig.key == "at_step":
            return self.step >= trig.value
        return self.useful_tokens >= trig.value

    def _advance(self, commit: dict[str, Any] | None) -> None:
        if self.t0 is None:
            return
        now = self.clock()
        for st in self.states:
            if st.status != ACTIVE or st.injected_at is None:
                continue
            f = st.fault
            if f.duration_s is not None and now - st.injected_at >= f.duration_s:
                self._heal(st, now, "duration")
            elif f.heal is not None and self._met(f.heal, now):
                self._heal(st, now, "heal_trigger", fired_by=commit if f.heal.by_progress else None)
        for st in self.states:  # a failed heal is retried while the run goes on, not only at its end
            if st.status == HEAL_FAILED and st.heal_failed_at is not None and now - st.heal_failed_at >= HEAL_RETRY_S:
                self._heal(st, now, "retry")
        for st in self.states:
            if st.status == ACTIVE and st.injected_at is not None:
                since = now - st.injected_at
                result, error, bounds = self._act(lambda st=st, since=since: st.nemesis.tick(self.handle, since))
                if error is not None:
                    self._emit("fault_failed", phase="followup", error=error, **self._fault_fields(st, now), **bounds)
                elif result:
                    self._emit("fault_followup", result=result, since_inject_s=round(since, 6),
                               **self._fault_fields(st, now), **bounds)
        for st in self.states:
            if st.status == PENDING and self._met(st.fault.trigger, now):
                self._inject(st, now, commit if st.fault.trigger.by_progress else None)
        self._release_gates()

    def _release_gates(self, *, every: bool = False) -> None:
        """Release the fault gate (ground/gates.py) of each `at_useful_tokens` value whose faults
        are all injected (or failed): the sites waiting at it go on. `every`: all of them (the
        driver stops; nobody may wait for it any more)."""
        pending = {int(st.fault.trigger.value) for st in self.states
                   if st.fault.trigger.key == "at_useful_tokens" and st.status == PENDING}
        for tokens in gates_of(st.fault for st in self.states):
            if (every or tokens not in pending) and tokens not in self._released:
                self._released.add(tokens)
                if gates.release(self.run_dir, tokens):
                    self._emit("fault_gate_released", gate_tokens=tokens, progress=self.progress(),
                               reason="driver_stopped" if tokens in pending else "injected")

    def _inject(self, st: FaultState, now: float, fired_by: dict[str, Any] | None) -> None:
        result, error, bounds = self._act(lambda: st.nemesis.inject(self.handle))
        common = {**self._fault_fields(st, now), "trigger": st.fault.trigger.to_dict(),
                  "fired_by": fired_by if fired_by is not None else {"t_s": round(now - (self.t0 or now), 6)}}
        if error is not None:
            st.status = FAILED
            self._emit("fault_failed", phase="inject", error=error, **common, **bounds)
            return
        st.status, st.injected_at = ACTIVE, now
        if takes_down(st.fault.kind, st.fault.params) and not self.noop:
            self._down.add(st.fault.target)
        heal_at: dict[str, Any] | None
        if st.fault.duration_s is not None:
            heal_at = {"after_s": st.fault.duration_s}
        elif st.fault.heal is not None:
            heal_at = st.fault.heal.to_dict()
        else:
            heal_at = None
        self._emit("fault_injected", result=result, params=dict(st.fault.params), heal_at=heal_at,
                   note=st.fault.note, noop=self.noop, **common, **bounds)
        if st.nemesis.instant:
            self._heal(st, now, "instant")

    def _heal(self, st: FaultState, now: float, reason: str, *, final: bool = False,
              fired_by: dict[str, Any] | None = None) -> None:
        result, error, bounds = self._act(lambda: st.nemesis.heal(self.handle, final=final))
        extra = {"reason": reason, "injected_for_s": round(now - st.injected_at, 6) if st.injected_at is not None
                 else None}
        if fired_by is not None:
            extra["fired_by"] = fired_by
        if error is not None:
            st.status, st.heal_failed_at = HEAL_FAILED, now
            self._emit("fault_failed", phase="heal", error=error, **extra, **self._fault_fields(st, now), **bounds)
            return
        st.status, st.healed_at = HEALED, now
        if result and result.get("restarted"):
            self._down.discard(st.fault.target)
        self._emit("fault_healed", result=result, **extra, **self._fault_fields(st, now), **bounds)

    def heal_all(self, *, restart: bool = False) -> None:
        """Heal every fault still injected (and retry failed heals). The run is ending, so by
        default no process is started again (restart=True does); links and stopped processes
        are always restored."""
        now = self.clock()
        for st in self.states:
            if st.status in (ACTIVE, HEAL_FAILED):
                self._heal(st, now, "heal_all", final=not restart)

    def finish(self) -> None:
        """Log `scenario_finished` once: the status of every fault (never-fired ones included)."""
        if self._finished:
            return
        self._finished = True
        self._release_gates(every=True)
        now = self.clock()
        self._emit("scenario_finished", scenario=self.scenario.name, started=self.t0 is not None,
                   t_s=round(now - self.t0, 6) if self.t0 is not None else None, progress=self.progress(),
                   statuses={str(s.index): s.status for s in self.states},
                   never_fired=[s.index for s in self.states if s.status == PENDING],
                   failed=[s.index for s in self.states if s.status in (FAILED, HEAL_FAILED)],
                   taken_down=sorted(self._down))


# ------------------------------------------------------------------------------ out of process


def until_run_finished(run_dir: str | Path) -> Callable[[], bool]:
    """True once the launcher logged `run_finished` (RUN/logs/launcher.jsonl)."""
    tail = LogTail(Path(run_dir) / "logs" / "launcher.jsonl")
    seen = {"done": False}

    def check() -> bool:
        if not seen["done"]:
            seen["done"] = any(ev.get("event") == "run_finished" for ev in tail.read())
        return seen["done"]

    return check


def main(argv: list[str] | None = None) -> int:
    """`python -m chaos.driver SCENARIO --run RUN_DIR`: run a scenario against a live `xdc run`."""
    from chaos.handle import ChaosError, NativeHandle, spawn_like_launcher
    from chaos.scenario import ScenarioError, load_scenario

    ap = argparse.ArgumentParser(prog="xdc chaos", description=main.__doc__)
    ap.add_argument("scenario", help="scenario file (YAML or TOML), e.g. scenarios/one-outage.yaml")
    ap.add_argument("--run", required=True, type=Path, help="run directory of a live run (e.g. runs/latest)")
    ap.add_argument("--dry-run", action="store_true", help="no-op nemeses: log what would happen, touch nothing")
    ap.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the run to start")
    ap.add_argument("--interval-s", type=float, default=0.1)
    args = ap.parse_args(argv)
    run_dir = args.run.resolve()
    sites = wait_for_topology(run_dir, args.wait_s, 0.2)
    if sites is None:
        return 2
    try:
        sc = load_scenario(args.scenario, sites=sites)
        handle = NativeHandle(run_dir, None, spawn_like_launcher(run_dir))
    except (ScenarioError, ChaosError) as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    finished = until_run_finished(run_dir)
    return run_scenario(sc, handle, run_dir, dry_run=args.dry_run, interval_s=args.interval_s,
                        finished=lambda _driver: finished)


def wait_for_topology(run_dir: Path, wait_s: float, poll_s: float) -> tuple[str, ...] | None:
    """The run's sites once RUN/topology.json exists; None (with a message) after wait_s."""
    deadline = time.monotonic() + wait_s
    while not (run_dir / "topology.json").exists():
        if time.monotonic() > deadline:
            print(f"chaos: {run_dir}/topology.json did not appear within {wait_s:g} s", file=sys.stderr)
            return None
        time.sleep(poll_s)
    return tuple(json.loads((run_dir / "topology.json").read_text())["sites"])


def run_scenario(sc: Scenario, handle: Any, run_dir: Path, *, dry_run: bool, interval_s: float,
                 finished: Callable[["ChaosDriver"], Callable[[], bool]]) -> int:
    """Drive `sc` through `handle` until the run is over or a signal arrives; 1 if a fault failed."""
    stop = {"flag": False}

    def _stop(_s: int, _f: object) -> None:
        stop["flag"] = True

    for s in (_signal.SIGINT, _signal.SIGTERM):
        _signal.signal(s, _stop)
    driver = ChaosDriver(sc, handle, run_dir, noop=dry_run)
    done = finished(driver)
    try:
        driver.run(lambda: stop["flag"] or done(), interval_s=interval_s)
    finally:
        close = getattr(handle.log, "close", None)
        if close:
            close()
    bad = [s.index for s in driver.states if s.status in (FAILED, HEAL_FAILED)]
    print(f"chaos: scenario {sc.name}: " + ", ".join(f"f{s.index} {s.fault.kind} {s.fault.target or '-'}: {s.status}"
                                                     for s in driver.states))
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
