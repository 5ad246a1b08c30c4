"""Fault gates (ground/gates.py): which round reaches a gate, how a site's wait ends, and the chaos
driver releasing a gate only once every fault at its tokens is injected (virtual clock, fake
coordinator log, RecordingHandle). The gates on a real cluster: tests/live/test_recovery_policies.py."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.scenario import Scenario
from ground import gates
from ground.config import RunConfig
from tests.unit.test_chaos_driver import rig  # noqa: F401  (the driver's fixture)
from chaos.policy_config import config_for_policy as with_policy


def test_a_round_reaches_the_gates_its_commit_fires() -> None:
    gs = (4096, 8192, 9000)
    assert gates.crossed(gs, 0, 4095) == []
    assert gates.crossed(gs, 0, 4096) == [4096]  # the first commit at or past 4096 ends here
    assert gates.crossed(gs, 4096, 8192) == [8192]  # 4096 was the round before's
    assert gates.crossed(gs, 4096, 12288) == [8192, 9000]  # one round, two gates
    assert gates.crossed(gs, 12288, 16384) == []


def test_gates_are_the_distinct_useful_token_triggers_of_a_scenario() -> None:
    sc = (Scenario.build("g").crash("b", at_useful_tokens=9000, restart_after_s=1)
          .blackhole("a<->c", at_useful_tokens=9000, duration_s=1)
          .hang("a", at_step=3, duration_s=1).hang("c", at_s=5, duration_s=1)
          .preempt("c", at_useful_tokens=4000))
    assert gates.gates_of(sc.faults) == (4000, 9000)
    for policy in ("stall", "restart", "elastic", "oracle"):
        assert with_policy(RunConfig(), policy, sc).recovery.fault_gates == (4000, 9000)
    assert with_policy(RunConfig(), "elastic", None).recovery.fault_gates == ()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_a_wait_ends_open_released_left_or_timed_out(tmp_path: Path) -> None:
    clock = Clock()
    assert gates.wait(tmp_path, 100, 1.0, lambda: False, clock=clock, sleep=clock.sleep) == "timeout"
    assert 1.0 <= clock.t < 1.01
    calls = {"n": 0}

    def leave_on_third() -> bool:
        calls["n"] += 1
        return calls["n"] == 3
    assert gates.wait(tmp_path, 100, 1.0, leave_on_third, clock=clock, sleep=clock.sleep) == "left"

    def release_then_stay() -> bool:
        gates.release(tmp_path, 100, by="test")
        return False
    assert gates.wait(tmp_path, 100, 1.0, release_then_stay, clock=clock, sleep=clock.sleep) == "released"
    assert gates.wait(tmp_path, 100, 1.0, lambda: True, clock=clock, sleep=clock.sleep) == "open"
    assert gates.release(tmp_path, 100) is False  # once only
    body = json.loads((tmp_path / "gates" / gates.gate_name(100)).read_text())
    assert body["tokens"] == 100 and body["by"] == "test"
    assert [p.name for p in (tmp_path / "gates").iterdir()] == [gates.gate_name(100)]  # no temp file left


def test_the_driver_releases_a_gate_once_every_fault_at_its_tokens_is_injected(
        rig, tmp_path: Path) -> None:  # noqa: F811
    clock, coord, handle, make = rig
    sc = (Scenario.build("gated").crash("b", at_useful_tokens=4000, restart_after_s=5)
          .blackhole("a<->c", at_useful_tokens=4000, duration_s=1)
          .hang("a", at_useful_tokens=9000, duration_s=1))
    d = make(sc)
    coord.epoch_formed()
    coord.commit(1, 2048)
    d.poll()
    assert not (tmp_path / "gates").exists()
    coord.commit(2, 4096)
    evs = d.poll()
    assert [e["event"] for e in evs] == ["fault_injected", "fault_injected", "fault_gate_released"]
    assert evs[-1]["gate_tokens"] == 4000 and evs[-1]["reason"] == "injected"
    assert gates.is_released(tmp_path, 4000) and not gates.is_released(tmp_path, 9000)
    assert d.poll() == []  # released once
    d.finish()  # the driver stops: nobody may wait for the fault that never came
    assert gates.is_released(tmp_path, 9000)
    rel = [e for e in handle.log.named("fault_gate_released") if e["gate_tokens"] == 9000]
    assert len(rel) == 1 and rel[0]["reason"] == "driver_stopped"


def test_the_policy_names_are_the_coordinators_policies_and_the_oracle_foresees_site_faults_only():
    from chaos.policy_config import oracle_faults
    from coordinator.recovery import Policy
    from ground.config import POLICIES

    assert POLICIES == tuple(p.value for p in Policy)
    sc = (Scenario.build("mixed").crash("b", at_useful_tokens=4000).degrade("a<->b", at_useful_tokens=5000, latency_ms=50)
          .crash("c", at_s=3.0))
    assert oracle_faults(sc) == (("b", 4000),)  # the link fault and the time-triggered crash are not foreseen
    assert with_policy(RunConfig(), "oracle", sc).recovery.oracle_faults == (("b", 4000),)
    assert with_policy(RunConfig(), "elastic", sc).recovery.oracle_faults == ()
