"""chaos/driver.py on a virtual clock, a fake coordinator log and the RecordingHandle: the exact
order of inject/heal calls, progress triggers at the right commit, heal_all at the end, and a
failing nemesis logged as `fault_failed` while the rest of the scenario still runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chaos.driver import ChaosDriver, until_run_finished
from chaos.handle import ChaosError, MemoryLog, RecordingHandle
from chaos.nemesis import Nemesis, nemesis_for
from chaos.scenario import Fault, Scenario, Trigger
from ground.eventlog import EventLog, read_events


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeCoord:
    """Appends coordinator events to RUN/logs/coord.jsonl the way the coordinator does."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "logs" / "coord.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.seq = 0
        self.epoch = 0

    def _write(self, ev: dict[str, Any], *, torn: bool = False) -> None:
        ev = {"id": f"coord:{self.seq}", "process": "coord", "epoch": self.epoch, **ev}
        self.seq += 1
        with open(self.path, "a") as f:
            line = json.dumps(ev) + "\n"
            f.write(line[: len(line) // 2] if torn else line)

    def epoch_formed(self, members: tuple[str, ...] = ("a", "b", "c")) -> None:
        self.epoch += 1
        self._write({"event": "membership_epoch", "members": list(members), "step": 0})

    def commit(self, step: int, useful_tokens: int) -> None:
        self._write({"event": "commit", "commit_id": f"e{self.epoch}r{step}", "round": step, "step": step,
                     "useful_tokens": useful_tokens})

    def other(self) -> None:
        self._write({"event": "heartbeat_stats"})


@pytest.fixture
def rig(tmp_path: Path):
    clock = Clock()
    coord = FakeCoord(tmp_path)
    handle = RecordingHandle(("a", "b", "c"))

    def make(sc: Scenario, **kw: Any) -> ChaosDriver:
        return ChaosDriver(sc, handle, tmp_path, clock=clock, **kw)

    return clock, coord, handle, make


def names(log: MemoryLog, *events: str) -> list[tuple]:
    return [(e["event"], e.get("fault")) for e in log.events if not events or e["event"] in events]


def test_nothing_happens_before_the_first_epoch(rig) -> None:
    clock, coord, handle, make = rig
    d = make(Scenario.build("s").crash("b", at_s=0))
    clock.t += 50
    coord.commit(5, 5000)  # progress without an epoch does not start the scenario
    assert d.poll() == [] and handle.calls == [] and not d.started
    coord.epoch_formed()
    evs = d.poll()
    assert [e["event"] for e in evs] == ["scenario_started", "fault_injected"]
    assert handle.calls == [("signal", "b", "SIGKILL")]
    # a second epoch (e.g. after the crash) does not restart the scenario clock
    t0 = d.t0
    clock.t += 3
    coord.epoch_formed(("a", "c"))
    d.poll()
    assert d.t0 == t0 and d.epoch == 2


def test_exact_history_of_inject_and_heal_calls(rig) -> None:
    clock, coord, handle, make = rig
    sc = (Scenario.build("history")
          .crash("b", at_s=10, restart_after_s=5)                           # f0: t=10 kill, t=15 restart
          .blackhole("a->b", at_step=4, duration_s=3)                       # f1: at the step-4 commit
          .degrade("a<->c", at_useful_tokens=3000, heal=Trigger(at_step=8), latency_ms=50)  # f2
          .hang("c", at_s=12))                                              # f3: permanent
    d = make(sc)
    coord.epoch_formed()
    d.poll()  # t=0 of the scenario
    assert handle.calls == []
    clock.t += 2
    coord.commit(2, 1536)
    d.poll()
    assert handle.calls == []
    clock.t += 1  # t=3
    coord.commit(4, 3072)  # meets both f1 (step 4) and f2 (3000 tokens)
    d.poll()
    assert handle.calls == [
        ("toxiproxy.add_toxic", "a_to_b", "chaos_blackhole_f1_up", "timeout", "upstream", {"timeout": 0}),
        ("toxiproxy.add_toxic", "b_to_a", "chaos_blackhole_f1_down", "timeout", "downstream", {"timeout": 0}),
        ("toxiproxy.add_toxic", "a_to_c", "chaos_latency_f2_up", "latency", "upstream", {"latency": 50, "jitter": 0}),
        ("toxiproxy.add_toxic", "c_to_a", "chaos_latency_f2_down", "latency", "downstream",
         {"latency": 50, "jitter": 0}),
        ("toxiproxy.add_toxic", "c_to_a", "chaos_latency_f2_up", "latency", "upstream", {"latency": 50, "jitter": 0}),
        ("toxiproxy.add_toxic", "a_to_c", "chaos_latency_f2_down", "latency", "downstream",
         {"latency": 50, "jitter": 0}),
    ]
    handle.calls.clear()
    clock.t += 2.999  # t=5.999: f1 not yet due
    d.poll()
    assert handle.calls == []
    clock.t += 0.001  # t=6: f1 healed after exactly 3 s
    d.poll()
    assert handle.calls == [("toxiproxy.remove_toxic", "a_to_b", "chaos_blackhole_f1_up"),
                            ("toxiproxy.remove_toxic", "b_to_a", "chaos_blackhole_f1_down")]
    handle.calls.clear()
    clock.t += 4  # t=10: crash b
    d.poll()
    clock.t += 2  # t=12: hang c
    d.poll()
    clock.t += 3  # t=15: restart b
    d.poll()
    assert handle.calls == [("signal", "b", "SIGKILL"), ("signal", "c", "SIGSTOP"), ("restart", "b")]
    handle.calls.clear()
    coord.commit(8, 6144)  # f2's heal trigger
    d.poll()
    assert [c[0] for c in handle.calls] == ["toxiproxy.remove_toxic"] * 4
    assert {c[2] for c in handle.calls} == {"chaos_latency_f2_up", "chaos_latency_f2_down"}
    handle.calls.clear()
    assert d.done  # only the permanent hang is left, until the end
    d.heal_all()
    d.finish()
    assert handle.calls == [("signal", "c", "SIGCONT")]
    log: MemoryLog = handle.log
    assert names(log, "fault_injected", "fault_healed") == [
        ("fault_injected", 1), ("fault_injected", 2), ("fault_healed", 1), ("fault_injected", 0),
        ("fault_injected", 3), ("fault_healed", 0), ("fault_healed", 2), ("fault_healed", 3)]
    healed = {e["fault"]: e for e in log.named("fault_healed")}
    assert healed[1]["reason"] == "duration" and healed[1]["injected_for_s"] == pytest.approx(3.0)
    assert healed[2]["reason"] == "heal_trigger" and healed[2]["fired_by"]["commit_id"] == "e1r8"
    assert healed[3]["reason"] == "heal_all" and healed[3]["result"]["signal"] == "SIGCONT"
    assert healed[0]["result"] == {"process": "b", "restarted": True, "pid": handle.pids["b"]}
    fin = log.named("scenario_finished")[0]
    assert fin["statuses"] == {"0": "healed", "1": "healed", "2": "healed", "3": "healed"}
    assert fin["never_fired"] == [] and fin["failed"] == []


def test_progress_triggers_fire_at_the_first_commit_that_meets_them(rig) -> None:
    clock, coord, handle, make = rig
    sc = (Scenario.build("progress")
          .hang("a", at_useful_tokens=4000, duration_s=1)
          .hang("b", at_step=7, duration_s=1)
          .hang("c", at_step=100, duration_s=1))
    d = make(sc)
    coord.epoch_formed()
    for step in range(1, 10):  # nine commits read in one poll
        coord.commit(step, step * 1024)
        coord.other()
    d.poll()
    inj = {e["fault"]: e for e in handle.log.named("fault_injected")}
    assert set(inj) == {0, 1}
    assert inj[0]["fired_by"]["commit_id"] == "e1r4" and inj[0]["fired_by"]["useful_tokens"] == 4096
    assert inj[1]["fired_by"]["commit_id"] == "e1r7"
    assert inj[0]["trigger"] == {"at_useful_tokens": 4000} and inj[1]["trigger"] == {"at_step": 7}
    # the event carries the progress at the moment it fired, and the log context follows commits
    assert inj[0]["progress"]["step"] == 4 and inj[0]["step"] == 4 and inj[0]["epoch"] == 1
    assert handle.calls == [("signal", "a", "SIGSTOP"), ("signal", "b", "SIGSTOP")]
    clock.t += 1
    d.run(until=lambda: True, sleep=lambda s: None)
    fin = handle.log.named("scenario_finished")[0]
    assert fin["never_fired"] == [2] and fin["statuses"]["2"] == "pending"


def test_torn_last_line_waits_for_the_rest(rig) -> None:
    clock, coord, handle, make = rig
    d = make(Scenario.build("torn").hang("a", at_step=3, duration_s=1))
    coord.epoch_formed()
    d.poll()
    ev = {"id": "coord:9", "event": "commit", "commit_id": "e1r3", "step": 3, "useful_tokens": 3072, "epoch": 1}
    line = json.dumps(ev) + "\n"
    with open(coord.path, "a") as f:
        f.write(line[:20])
    d.poll()
    assert handle.calls == []
    with open(coord.path, "a") as f:
        f.write(line[20:])
    d.poll()
    assert handle.calls == [("signal", "a", "SIGSTOP")]


def test_heal_all_at_the_end_heals_what_is_still_injected(rig) -> None:
    clock, coord, handle, make = rig
    sc = (Scenario.build("end")
          .crash("a", at_s=1)                                 # permanent: not restarted at the end
          .blackhole("b", at_s=1)                             # permanent link fault: removed
          .reset("a<->c", at_s=1, duration_s=100)             # healing point after the end
          .store_outage(at_s=1, duration_s=100))               # stopped store: SIGCONT
    d = make(sc)
    coord.epoch_formed()
    d.poll()
    clock.t += 1
    d.poll()
    assert handle.state["store"] == "stopped" and handle.toxiproxy.enabled["a_to_c"] is False
    assert sum(len(t) for t in handle.toxiproxy.toxics.values()) == 12  # 6 proxies x 2 streams of b
    handle.calls.clear()
    stop_after = iter([False, False, True])
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock.t += s

    d.run(until=lambda: next(stop_after), interval_s=0.25, sleep=sleep)
    assert slept == [0.25, 0.25]
    assert ("restart", "a") not in handle.calls  # the run is ending: no process is started again
    assert handle.state["store"] == "running" and handle.state["a"] == "exited"
    assert all(handle.toxiproxy.enabled.values())
    assert all(not t for t in handle.toxiproxy.toxics.values())
    healed = handle.log.named("fault_healed")
    assert [e["fault"] for e in healed] == [0, 1, 2, 3] and {e["reason"] for e in healed} == {"heal_all"}
    assert healed[0]["result"] == {"process": "a", "restarted": False, "reason": "run ending"}
    assert d.taken_down() == {"a"}
    assert handle.log.named("scenario_finished")[0]["taken_down"] == ["a"]
    d.finish()  # only once
    assert len(handle.log.named("scenario_finished")) == 1


def test_heal_all_with_restart_starts_processes_again(rig) -> None:
    clock, coord, handle, make = rig
    d = make(Scenario.build("r").crash("a", at_s=0).coord_crash(at_s=0))
    coord.epoch_formed()
    d.poll()
    assert d.taken_down() == {"a", "coord"}
    d.heal_all(restart=True)
    assert handle.calls[-2:] == [("restart", "a"), ("restart", "coord")]
    assert d.taken_down() == set()


class Exploding(Nemesis):
    kind = "site_hang"

    def inject(self, handle: Any) -> dict[str, Any]:
        raise RuntimeError("boom")

    def heal(self, handle: Any, *, final: bool = False) -> dict[str, Any]:
        return {}


def test_a_failing_nemesis_is_logged_and_the_rest_still_run(rig) -> None:
    clock, coord, handle, make = rig
    sc = (Scenario.build("fail")
          .crash("b", at_s=1)                             # f0 ok
          .crash("b", at_s=2, restart_after_s=1)          # f1 fails: b is not running any more
          .hang("c", at_s=2, duration_s=1)                # f2 explodes (custom nemesis)
          .degrade("a->b", at_s=3, duration_s=1, latency_ms=10))  # f3 still runs

    def factory(f: Fault, i: int, *, noop: bool = False) -> Nemesis:
        return Exploding(f, i) if i == 2 else nemesis_for(f, i, noop=noop)

    d = make(sc, nemesis_factory=factory)
    coord.epoch_formed()
    for _ in range(5):
        clock.t += 1
        d.poll()
    failed = handle.log.named("fault_failed")
    assert [(e["fault"], e["phase"]) for e in failed] == [(1, "inject"), (2, "inject")]
    assert "ChaosError" in failed[0]["error"] and "not running" in failed[0]["error"]
    assert failed[1]["error"] == "RuntimeError: boom"
    assert [e["fault"] for e in handle.log.named("fault_injected")] == [0, 3]
    assert [e["fault"] for e in handle.log.named("fault_healed")] == [3]
    assert [s.status for s in d.states] == ["active", "failed", "failed", "healed"]
    for e in failed:  # the action's real bounds are there even when it failed
        assert e["start_mono_ns"] <= e["end_mono_ns"] and e["start_wall_ns"] <= e["end_wall_ns"]


def test_a_failing_heal_is_retried_during_the_run(rig) -> None:
    """Toxiproxy's API can stall removing a toxic (seen in the soak): the fault must not stay on
    until the end of the run; the driver tries again every HEAL_RETRY_S."""
    from chaos.driver import HEAL_RETRY_S

    clock, coord, handle, make = rig
    d = make(Scenario.build("hr").blackhole("a->b", at_s=0, duration_s=1))
    coord.epoch_formed()
    d.poll()
    real_remove = handle.toxiproxy.remove_toxic
    handle.toxiproxy.remove_toxic = lambda p, n: (_ for _ in ()).throw(ChaosError("api hangs"))  # type: ignore
    clock.t += 1
    d.poll()
    assert d.states[0].status == "heal_failed"
    handle.toxiproxy.remove_toxic = real_remove  # type: ignore
    clock.t += HEAL_RETRY_S
    d.poll()
    healed = handle.log.named("fault_healed")
    assert d.states[0].status == "healed" and [e["reason"] for e in healed] == ["retry"]


def test_a_failing_heal_is_logged_and_retried_by_heal_all(rig) -> None:
    clock, coord, handle, make = rig
    d = make(Scenario.build("hf").blackhole("a->b", at_s=0, duration_s=1))
    coord.epoch_formed()
    d.poll()
    real_remove = handle.toxiproxy.remove_toxic
    handle.toxiproxy.remove_toxic = lambda p, n: (_ for _ in ()).throw(ChaosError("api hangs"))  # type: ignore
    clock.t += 1
    d.poll()
    assert handle.log.named("fault_failed")[0]["phase"] == "heal" and d.states[0].status == "heal_failed"
    clock.t += 1
    d.poll()  # not retried on every poll
    assert len(handle.log.named("fault_failed")) == 1
    handle.toxiproxy.remove_toxic = real_remove  # type: ignore
    d.heal_all()
    assert d.states[0].status == "healed" and all(not t for t in handle.toxiproxy.toxics.values())


def test_preemption_grace_runs_on_the_virtual_clock(rig) -> None:
    clock, coord, _, make = rig
    handle = RecordingHandle(("a", "b", "c"), ignore_term={"c"})  # c ignores its notice
    d = ChaosDriver(Scenario.build("p").preempt("c", at_s=0, grace_s=5, return_after_s=20)
                    .preempt("b", at_s=0, grace_s=5), handle, coord.path.parent.parent, clock=clock)
    coord.epoch_formed()
    d.poll()
    assert handle.calls == [("signal", "c", "SIGTERM"), ("signal", "b", "SIGTERM")]
    assert handle.state["c"] == "running" and handle.state["b"] == "exited"
    clock.t += 4.9
    d.poll()
    assert handle.calls[2:] == []
    fu = handle.log.named("fault_followup")
    assert [(e["fault"], e["result"]["action"]) for e in fu] == [(1, "exited_within_grace")]
    clock.t += 0.1
    d.poll()
    assert handle.calls[2:] == [("signal", "c", "SIGKILL")]
    fu = handle.log.named("fault_followup")
    assert fu[-1]["fault"] == 0 and fu[-1]["result"]["action"] == "sigkill_after_grace"
    assert fu[-1]["since_inject_s"] == pytest.approx(5.0)
    clock.t += 15
    d.poll()
    assert handle.calls[3:] == [("restart", "c")]
    assert d.taken_down() == {"b"}


def test_instant_restart_is_injected_and_healed_at_once(rig) -> None:
    clock, coord, handle, make = rig
    d = make(Scenario.build("rs").restart("a", at_step=2))
    coord.epoch_formed()
    coord.commit(2, 100)
    d.poll()
    assert handle.calls == [("signal", "a", "SIGKILL"), ("restart", "a")]
    assert names(handle.log, "fault_injected", "fault_healed") == [("fault_injected", 0), ("fault_healed", 0)]
    assert handle.log.named("fault_healed")[0]["reason"] == "instant" and d.taken_down() == set()


def test_noop_driver_touches_nothing(rig) -> None:
    clock, coord, handle, make = rig
    sc = Scenario.build("dry").crash("a", at_s=0, restart_after_s=1).blackhole("a<->b", at_s=0, duration_s=1)
    d = make(sc, noop=True)
    coord.epoch_formed()
    d.poll()
    clock.t += 1
    d.poll()
    assert handle.calls == []
    inj = handle.log.named("fault_injected")
    assert [e["result"] for e in inj] == [{"noop": True, "stands_for": "site_crash", "target": "a"},
                                          {"noop": True, "stands_for": "link_blackhole", "target": "a<->b"}]
    assert all(e["noop"] for e in inj) and len(handle.log.named("fault_healed")) == 2 and d.taken_down() == set()


def test_events_go_to_a_real_event_log_with_both_clocks(tmp_path: Path) -> None:
    clock = Clock()
    coord = FakeCoord(tmp_path)
    log = EventLog(tmp_path / "logs" / "chaos.jsonl", "run-1", "chaos")
    handle = RecordingHandle(log=log)
    d = ChaosDriver(Scenario.build("real").hang("b", at_s=1, duration_s=2), handle, tmp_path, clock=clock)
    coord.epoch_formed()
    coord.commit(3, 3072)
    d.poll()
    clock.t += 1
    d.poll()
    clock.t += 2
    d.poll()
    d.finish()
    log.close()
    evs = read_events(tmp_path / "logs" / "chaos.jsonl")
    assert [e["event"] for e in evs] == ["scenario_started", "fault_injected", "fault_healed", "scenario_finished"]
    for e in evs:
        assert e["process"] == "chaos" and e["run_id"] == "run-1" and e["id"].startswith("chaos:")
        assert isinstance(e["wall_ns"], int) and isinstance(e["mono_ns"], int)
    inj, healed = evs[1], evs[2]
    assert inj["epoch"] == 1 and inj["step"] == 3  # the cluster's epoch and step, not the driver's
    assert (inj["fault"], inj["kind"], inj["target"], inj["t_s"]) == (0, "site_hang", "b", 1.0)
    assert inj["result"]["signal"] == "SIGSTOP" and healed["result"]["signal"] == "SIGCONT"
    assert inj["start_mono_ns"] <= inj["end_mono_ns"] <= healed["start_mono_ns"]
    assert evs[0]["faults"] == [Scenario.build("x").hang("b", at_s=1, duration_s=2).faults[0].to_dict()]


def test_until_run_finished(tmp_path: Path) -> None:
    done = until_run_finished(tmp_path)
    assert not done()
    log = EventLog(tmp_path / "logs" / "launcher.jsonl", "r", "launcher")
    log.emit("process_started", name="a", pid=1)
    assert not done()
    log.emit("run_finished", exit_codes={})
    log.close()
    assert done() and done()


def test_link_specs_resolve_to_proxies_and_streams_by_one_rule() -> None:
    """x->y = (x_to_y, upstream) + (y_to_x, downstream); a reset disables the proxies that carry the
    direction upstream, or, for coord->a (no such proxy), the one that carries it at all."""
    from chaos.handle import proxies_for_reset

    h = RecordingHandle(("a", "b", "c"))
    assert h.links("a->b") == [("a_to_b", "upstream"), ("b_to_a", "downstream")]
    assert h.links("b<-a") == h.links("a->b")
    assert h.links("a<->b") == [("a_to_b", "upstream"), ("b_to_a", "downstream"),
                                ("b_to_a", "upstream"), ("a_to_b", "downstream")]
    assert h.links("a->coord") == [("a_to_coord", "upstream")]
    assert h.links("coord->a") == [("a_to_coord", "downstream")]
    assert {p for p, _ in h.links("c")} == {"a_to_c", "c_to_a", "b_to_c", "c_to_b", "c_to_coord", "c_to_store"}
    assert proxies_for_reset(h.links("a->b")) == ["a_to_b"]
    assert proxies_for_reset(h.links("a<->b")) == ["a_to_b", "b_to_a"]
    assert proxies_for_reset(h.links("coord->a")) == ["a_to_coord"]
    assert proxies_for_reset(h.links("c<->coord")) == ["c_to_coord"]
    with pytest.raises(ChaosError, match="unknown process 'd'"):
        h.links("a<->d")
    with pytest.raises(ChaosError, match="is an end of no link"):
        h.links("d")
