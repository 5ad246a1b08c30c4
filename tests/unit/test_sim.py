"""The simulator on its virtual clock (sim/): pure, deterministic, seconds.

Checks: the collective's time is the emulator's algorithm (two latency phases plus the shard's
bandwidth term, chunked); a run without faults reaches the target in the rounds the schedule
says; a run is deterministic; the coordinator's logged inputs replay through the core to the
same decisions (the simulator drives the core, it does not copy it); the real
scenarios/one-outage.yaml and preemption.yaml under all four policies pass every applicable checker; a 50-site,
5-simulated-minute run is consistent (the scale bench's small version).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.analyze import analyze
from analysis.artifact import build_artifact
from chaos.scenario import Scenario, load_scenario
from ground.config import RunConfig, load_config, merge
from ground.schedule import rounds_for_target, target_samples
from sim.cli import main as sim_main
from sim.faults import UnsupportedFault
from sim.calibrate import ROUND_END_MIN, calibrate, round_end_fit
from sim.model import SimModel, collective_end_s, collective_s, n_params, payload_bytes_sent
from sim.world import simulate
from tests.conftest import COMPARE_CFG
from tests.helpers_coordinator_core import replay

ROOT = Path(__file__).resolve().parents[2]


def cfg_for(policy: str = "restart", **over: object):
    return load_config(merge(merge(COMPARE_CFG, {"run_id": f"sim-{policy}", "recovery": {"policy": policy}}), over))


def test_n_params_matches_the_emulators_logged_model() -> None:
    # site_started of an emulator run with the default ModelConfig logs n_params = 842,496.
    assert n_params(load_config({}).model) == 842_496


def test_the_collective_is_two_latency_phases_plus_the_shards_bandwidth_term() -> None:
    cfg = load_config(merge(COMPARE_CFG, {"wan": {"site_link": {"up": {"latency_ms": 40, "bandwidth_kbps": 1000}},
                                                 "chunk_bytes": 1_000_000}}))
    m = SimModel(collective_part_overhead_s=0.0, collective_cpu_s=0.0)
    p = 3_000_000  # values: 1,000,000 per shard among 3 members, 4 MB each
    got = collective_s(cfg, m, ("a", "b", "c"), p)
    assert got == pytest.approx(2 * (0.040 + 4_000_000 / 1_000_000))
    # int8 carries a quarter of the bytes; a part overhead counts once per 1 MB chunk of the shard
    assert collective_s(cfg, m, ("a", "b", "c"), p, "int8") == pytest.approx(2 * (0.040 + 1.0))
    m2 = replace(m, collective_part_overhead_s=0.01)
    assert collective_s(cfg, m2, ("a", "b", "c"), p) - got == pytest.approx(2 * 4 * 0.01)
    assert payload_bytes_sent(3, 842_496) == 4_493_312  # as the emulator's collective span logs


def test_a_run_without_faults_commits_every_round_and_completes(tmp_path: Path) -> None:
    cfg = cfg_for()
    res = simulate(cfg, None, out=tmp_path / "run")
    assert res.complete and res.epochs == 1
    assert res.commits == rounds_for_target(cfg, 3)
    assert res.useful_tokens == target_samples(cfg) * cfg.model.seq_len


def test_a_step_floor_sets_the_simulated_step_time_as_it_does_the_emulators(tmp_path: Path) -> None:
    """`train.step_floor_ms` (site_agent/rounds.py waits out the rest of a faster step): a simulated
    step takes max(the model's step time, the floor); a floor below the model's step changes nothing."""
    from ground.eventlog import process_events

    def compute_s(floor_ms: float, out: str) -> list[float]:
        res = simulate(cfg_for(train={"step_floor_ms": floor_ms}), None, out=tmp_path / out)
        assert res.complete
        return [(e["end_mono_ns"] - e["start_mono_ns"]) / 1e9 for e in process_events(tmp_path / out, "a")
                if e["event"] == "compute"]

    model_step_s = SimModel().compute_s_per_token * 8 * 128  # COMPARE_CFG: 8 samples x 128 tokens
    assert compute_s(0.0, "none") == compute_s(model_step_s * 500, "low")  # a floor under the model's step
    slow = compute_s(model_step_s * 3000, "high")
    assert slow and all(t == pytest.approx(4 * model_step_s * 3) for t in slow)  # H = 4 steps at the floor


def test_the_last_round_cut_at_the_target_takes_only_its_non_empty_steps(tmp_path: Path) -> None:
    """site_agent/rounds.py skips an inner step whose batch is empty (the last round, cut at the
    target) without computing or waiting out the floor; so does the simulator. 720 samples are
    7.5 rounds of 3 sites x 8 x H = 4: the last round is 2 steps per site, and it is half as long."""
    from ground.eventlog import process_events

    floor_s = 0.5
    cfg = cfg_for(train={"step_floor_ms": floor_s * 1000, "target_useful_tokens": 720 * 128})
    res = simulate(cfg, None, out=tmp_path / "run")
    assert res.complete and res.commits == 8
    for site in ("a", "b", "c"):
        spans = [(e["round"], (e["end_mono_ns"] - e["start_mono_ns"]) / 1e9, e["samples"])
                 for e in process_events(tmp_path / "run", site) if e["event"] == "compute"]
        assert [r for r, _s, _n in spans] == list(range(8))
        assert [t for _r, t, _n in spans] == pytest.approx([4 * floor_s] * 7 + [2 * floor_s])
        assert [n for _r, _t, n in spans] == [32] * 7 + [16]


def test_a_simulation_is_deterministic(tmp_path: Path) -> None:
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    for name in ("one", "two"):
        simulate(cfg_for("elastic"), scen, out=tmp_path / name)
    for log in ("coord", "a", "b", "chaos", "store"):
        assert (tmp_path / "one" / "logs" / f"{log}.jsonl").read_text() == \
            (tmp_path / "two" / "logs" / f"{log}.jsonl").read_text(), log


@pytest.mark.parametrize("policy", ["stall", "restart", "elastic", "oracle"])
def test_a_simulated_coordinator_log_replays_through_the_core(tmp_path: Path, policy: str) -> None:
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    cfg = cfg_for(policy)
    if policy == "oracle":
        cfg = replace(cfg, recovery=replace(cfg.recovery, oracle_faults=(("b", 36_864),)))
    simulate(cfg, scen, out=tmp_path / policy)
    inputs, decisions = replay(tmp_path / policy)
    assert inputs > 50 and decisions > 10


@pytest.mark.parametrize("scenario", ["one-outage", "preemption"])
def test_a_scenario_file_under_four_policies_passes_every_applicable_checker(tmp_path: Path, scenario: str) -> None:
    out = tmp_path / "cmp"
    rc = sim_main(["run", str(ROOT / "scenarios" / f"{scenario}.yaml"), "--sites", "3", "--policy", "all",
                   "--out", str(out), "--set", "train.target_useful_tokens=1179648"])
    assert rc == 0
    runs = sorted(p for p in out.iterdir() if (p / "sim.json").exists())
    assert [p.name for p in runs] == ["elastic", "oracle", "restart", "stall"]
    art = analyze([out], report=False).artifact  # `xdc analyze DIR`: the comparison's index.json
    status = {c["name"]: c["status"] for c in art["checks"]}
    assert status.pop("byte_classes") == "unknown"  # no Toxiproxy counters in a simulation
    assert set(status.values()) == {"pass"}, status
    byte_check = next(c for c in art["checks"] if c["name"] == "byte_classes")
    assert all("a simulated run: no Toxiproxy counts its bytes" in line for line in byte_check["evidence"])
    epochs = {json.loads((p / "sim.json").read_text())["policy"]: p for p in runs}
    assert set(epochs) == {"stall", "restart", "elastic", "oracle"}


def test_faults_the_simulator_does_not_model_are_refused_not_ignored() -> None:
    sc = Scenario.build("t", "").degrade("a<->b", latency_ms=50, toxicity=0.5, at_s=1.0, duration_s=1.0)
    with pytest.raises(UnsupportedFault, match="toxicity"):
        simulate(cfg_for(), sc)


def test_the_storm_scenario_runs_with_every_checker_passing(tmp_path: Path) -> None:
    """scenarios/fault-storm.yaml (every fault kind: a hang, a one-way blackhole, a stopped store, a
    reset service link, crashes, a coordinator crash, a restart, a sliced link) runs to completion,
    every fault fired, every applicable checker passing."""
    from ground.eventlog import process_events

    cfg = cfg_for("elastic", train={"target_useful_tokens": 786_432})
    res = simulate(cfg, load_scenario(ROOT / "scenarios" / "fault-storm.yaml", sites=["a", "b", "c"]),
                   out=tmp_path / "storm")
    assert res.complete
    fin = next(e for e in process_events(tmp_path / "storm", "chaos") if e["event"] == "scenario_finished")
    assert not fin["never_fired"], fin
    status = {c["name"]: c["status"] for c in build_artifact([tmp_path / "storm"])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"
    assert set(status.values()) == {"pass"}, status


@pytest.mark.parametrize("policy", ["stall", "restart", "elastic", "oracle"])
def test_a_partition_is_reported_by_the_site_that_hears_nothing_and_every_checker_passes(tmp_path: Path,
                                                                                         policy: str) -> None:
    """a<->c blackholed for 30 s (as scenarios/partition.yaml, twice as long), both still reach the
    coordinator: the round in flight cannot complete; after wan.collective_stall_ms (15 s) a and c
    each report the peer they hear nothing from (site_agent's PeerUnreachable), the coordinator,
    its claim corroborated by the other end, fails one of them, and the run completes with a
    balanced ledger. The 15 s partition of the scenario
    file heals before anyone's stall timeout: it only delays the run, nobody fails."""
    from ground.eventlog import process_events

    cfg = cfg_for(policy, train={"target_useful_tokens": 393_216})
    if policy == "oracle":
        cfg = replace(cfg, recovery=replace(cfg.recovery, oracle_faults=()))  # a partition: no site fault to see
    scen = Scenario.build("partition-30s", "").blackhole("a<->c", at_useful_tokens=65_000, duration_s=30)
    out = tmp_path / policy
    res = simulate(cfg, scen, out=out)
    assert res.complete and res.epochs >= 2
    reports = [(s, e["peer"]) for s in "abc" for e in process_events(out, s) if e["event"] == "peer_unreachable"]
    assert reports and all({s, p} == {"a", "c"} for s, p in reports), reports
    cut = next(e for e in process_events(out, "chaos") if e["event"] == "fault_injected")
    failed = next(e for e in process_events(out, "coord") if e["event"] == "site_failed")
    # both ends' collectives stall, both claim the other: corroborated (coordinator/claims.py), the one
    # claimed first goes
    assert sorted(reports) == [("a", "c"), ("c", "a")], reports
    assert failed["site"] in {"a", "c"} and re.search(r"[ac] and [ac] cannot reach each other: [ac] goes",
                                                       failed["reason"]), failed
    assert (failed["mono_ns"] - cut["mono_ns"]) / 1e9 >= cfg.wan.collective_stall_ms / 1000
    status = {c["name"]: c["status"] for c in build_artifact([out])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"
    assert set(status.values()) == {"pass"}, status
    short = simulate(cfg, load_scenario(ROOT / "scenarios" / "partition.yaml"), out=tmp_path / "short")
    base = simulate(cfg, None)
    assert short.complete and short.epochs == 1 and short.sim_s > base.sim_s


def test_a_small_scale_run_is_consistent() -> None:
    """The scale bench's small version: 50 sites, 5 simulated minutes, one failure; no logs written."""
    sites = tuple(f"s{i:03d}" for i in range(50))
    cfg = load_config({"cluster": {"sites": list(sites)}, "train": {"target_useful_tokens": 10 ** 12},
                       "recovery": {"policy": "elastic"}})
    scen = Scenario.build("scale", "").crash("s007", at_s=60, restart_after_s=30)
    model = SimModel(heartbeat_period_ms=1000, restart_s=20)
    res = simulate(cfg, scen, model, max_sim_s=300)
    assert not res.complete and res.sim_s <= 300
    assert res.epochs == 3  # formed, s007 failed (elastic continues), s007 rejoined by state transfer
    per_round = cfg.train.per_site_batch * cfg.train.inner_steps_h * cfg.model.seq_len
    assert res.useful_tokens % per_round == 0 and res.useful_tokens >= res.commits * 49 * per_round


@pytest.mark.parametrize("period_ms", [None, 5])
def test_a_run_without_logs_is_the_same_run_as_with_logs(tmp_path: Path, period_ms: int | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without logs, a run's heartbeats are scheduled in bulk (sim/services.Heartbeats._beat_plain),
    with logs one site at a time: the same clock entries, so the same run. At a 5 ms period each
    beat arrives at the coordinator (5 ms away) at the instant of the next beat: the bulk path's
    one-by-one case. Without logs a whole round's steps are made only when a carried epoch asks
    for them (sim/progress.Progress.taken): the survivors of the crash keep the same steps."""
    from sim.rounds import Rounds

    cfg = cfg_for("elastic")
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    model = SimModel(heartbeat_period_ms=period_ms) if period_ms else SimModel()
    kept: list[list[tuple[str, int, object]]] = []
    real_carry_over = Rounds.carry_over

    def carry_over(self: Rounds, s: object, plan: object, sp: dict[str, object]) -> bool:
        got = real_carry_over(self, s, plan, sp)
        kept[-1].append((s.name, plan.epoch, sp.get("carried_steps")))  # type: ignore[attr-defined]
        return got

    monkeypatch.setattr(Rounds, "carry_over", carry_over)

    def seen(r: object) -> tuple[object, ...]:
        return (r.sim_s, r.complete, r.commits, r.epochs, r.core_steps, r.events_run, r.useful_tokens,
                {k: n for k, (n, _s) in r.core_by_kind.items()})

    kept.append([])
    bare = simulate(cfg, scen, model)
    kept.append([])
    logged = simulate(cfg, scen, model, out=tmp_path / "run")
    assert bare.complete and bare.epochs == 3
    assert seen(bare) == seen(logged)
    assert kept[0] == kept[1] and any(k for _s, _e, k in kept[0])  # the same steps kept, and some were
    if period_ms:
        assert bare.core_by_kind["heartbeat"][0] > 10_000  # 3 sites x ~30 s / 5 ms


def _case_24(scenario: str, policy: str, mode: str, confirm_ms: int = 0) -> tuple[RunConfig, Scenario]:
    """A 24-site config and scenario (24: the reports reach the coordinator at several instants);
    `confirm_ms`: the silence after the heartbeat timeout before a suspect is failed."""
    from chaos.policy_config import config_for_policy as with_policy
    from sim.cli import site_names

    names = site_names(24)
    scen = load_scenario(ROOT / "scenarios" / f"{scenario}.yaml", sites=names)
    return with_policy(load_config({"cluster": {"sites": names}, "recovery": {"failure_confirm_ms": confirm_ms},
                                    "train": {"target_useful_tokens": 4_000_000, "mode": mode}}), policy, scen), scen


def _whole_run(cfg: RunConfig, scen: Scenario, monkeypatch: pytest.MonkeyPatch) -> tuple[object, ...]:
    """An unlogged run and everything it ends with: result, the core's whole state (the controller's
    evidence too), every site's state, the recovery decisions; and the coordinator's history: every
    output of its core (decisions, journal records, sends), with the virtual time it was carried out."""
    import sim.world as sw
    from sim.coord import SimCoordinator

    worlds: list[object] = []
    real = sw.World
    history: list[tuple[int, object]] = []
    real_apply = SimCoordinator._apply

    class Seen(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a: object, **k: object) -> None:
            super().__init__(*a, **k)
            worlds.append(self)

    def apply(self: SimCoordinator, outputs: list[object], journal: bool = True) -> None:
        history.extend((self.w.clock.now_ns, o) for o in outputs)
        real_apply(self, outputs, journal)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(sw, "World", Seen)
        m.setattr(SimCoordinator, "_apply", apply)
        r = simulate(cfg, scen, SimModel(), max_sim_s=3000)
    w = worlds[-1]
    st = w.coord.state  # type: ignore[attr-defined]
    sites = sorted((s.name, s.phash, s.retained, s.round, s.epoch, s.gen, s.alive)
                   for s in w.sites.values())  # type: ignore[attr-defined]
    return (r.sim_s, r.complete, r.commits, r.epochs, r.core_steps, r.events_run, r.useful_tokens, r.never_fired,
            {k: n for k, (n, _s) in r.core_by_kind.items()}, st, sites, w.decisions,  # type: ignore[attr-defined]
            history)


@pytest.mark.parametrize("scenario,policy,mode", [
    ("one-outage", "elastic", "local"), ("one-outage", "restart", "sync"), ("churn", "stall", "local"),
    ("preemption", "oracle", "local"), ("partition", "elastic", "local"), ("fault-storm", "restart", "local")])
def test_a_round_of_members_in_bulk_is_the_same_run_as_one_member_at_a_time(
        scenario: str, policy: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without logs, the members of a round finish their compute and their all-reduce in one pass each
    (sim/rounds.Rounds._computed_many, _reduced_many: their next rounds and reports scheduled per
    instant). With those replaced by one `computed` / `reduced` call per member, in order, the run is
    the same: every commit, epoch, clock entry and site state. 24 sites, so that the reports reach the
    coordinator at several instants; the scenarios crash, preempt, cut and churn mid-round."""
    from sim.rounds import Rounds

    cfg, scen = _case_24(scenario, policy, mode)

    def run() -> tuple[object, ...]:
        return _whole_run(cfg, scen, monkeypatch)

    calls: list[str] = []  # the one-member calls made
    for name in ("computed", "reduced"):
        real_call = getattr(Rounds, name)
        monkeypatch.setattr(Rounds, name, lambda self, *a, _f=real_call, _n=name: calls.append(_n) or _f(self, *a))
    bulk = run()
    in_bulk = len(calls)
    with monkeypatch.context() as m:
        m.setattr(Rounds, "_computed_many", lambda self, items: [self.computed(*a) for a in items] and None)
        m.setattr(Rounds, "_reduced_many", lambda self, items: [self.reduced(*a) for a in items] and None)
        one_by_one = run()
    assert bulk[1] and not bulk[7]  # complete, every fault fired
    assert bulk == one_by_one
    assert in_bulk < (len(calls) - in_bulk) / 4  # most rounds went through the bulk passes


@pytest.mark.parametrize("scenario,policy,mode", [
    ("one-outage", "elastic", "local"), ("churn", "restart", "sync"), ("partition", "stall", "local")])
def test_an_instants_messages_of_one_kind_as_one_core_input_are_the_same_run_as_one_message_each(
        scenario: str, policy: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without logs, the messages of one instant after its first, a run of one kind at a time, reach
    the core as one core.Messages input (sim/coord.SimCoordinator._receive_plain): heartbeats and round
    reports through their common case in one pass. With every message a Received of its own instead,
    the run is the same: every core output at the same virtual time, every commit, epoch, site state
    and the core's whole state."""
    from coordinator import commits
    from coordinator.rules import Rules
    from coordinator.core import RECEIVED
    from sim.coord import SimCoordinator

    cfg, scen = _case_24(scenario, policy, mode)
    batches: dict[str, list[int]] = {"heartbeat": [], "round_done": []}
    for owner, name, kind in ((Rules, "_heartbeats", "heartbeat"), (commits, "round_reports", "round_done")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda w, msgs, now, _f=real, _k=kind: batches[_k].append(len(msgs))
                            or _f(w, msgs, now))
    batched = _whole_run(cfg, scen, monkeypatch)

    def one_each(self: SimCoordinator, msgs: list[tuple[object, ...]], now: int, heard_lost: bool) -> None:
        outs = self._step_all([RECEIVED(*m) for m in msgs], now)
        tick = self._needs_tick([m[3] for m in msgs], outs, now, heard_lost)  # type: ignore[misc]
        for out in outs:
            if out:
                self._apply(out)
            if tick and not self.tick_due:
                self.request_tick()

    with monkeypatch.context() as m:
        m.setattr(SimCoordinator, "_receive_plain", one_each)
        single = _whole_run(cfg, scen, monkeypatch)
    assert batched[1] and not batched[7]  # complete, every fault fired
    assert batched == single
    for kind, sizes in batches.items():  # most of each kind went in batches
        assert max(sizes) >= 12 and sum(sizes) > batched[8][kind] / 2, kind  # type: ignore[index]


@pytest.mark.parametrize("scenario,policy,mode,confirm_ms", [
    ("one-outage", "elastic", "local", 0), ("churn", "restart", "sync", 0), ("partition", "stall", "local", 0),
    ("fault-storm", "oracle", "local", 0), ("preemption", "restart", "local", 0), ("straggler", "elastic", "local", 0),
    ("straggler", "stall", "sync", 0), ("straggler", "elastic", "local", 2000),
    ("fault-storm", "restart", "sync", 2000)])
def test_ticks_left_out_after_calm_heartbeats_and_put_off_deadlines_change_nothing(
        scenario: str, policy: str, mode: str, confirm_ms: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated coordinator ticks neither after an instant of heartbeats in a calm cluster nor at a
    deadline that heartbeats have put off (sim/coord.SimCoordinator._needs_tick, _deadline_tick). With a
    tick after every instant and at every deadline, the run is the same: every output of the core at
    the same virtual time, every commit, epoch, site state, recovery decision and the core's whole
    state; only the ticks (and the clock entries that ran them) are fewer. (A hung site that resumes
    within `confirm_ms` is a suspect cleared by a heartbeat.)"""
    from sim.coord import SimCoordinator

    cfg, scen = _case_24(scenario, policy, mode, confirm_ms)
    fewer = _whole_run(cfg, scen, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(SimCoordinator, "_needs_tick", lambda self, *a: True)
        m.setattr(SimCoordinator, "_late", lambda self, now: True)
        every = _whole_run(cfg, scen, monkeypatch)

    def but_ticks(r: tuple[object, ...]) -> tuple[object, ...]:
        kinds = {k: n for k, n in r[8].items() if k != "tick"}  # type: ignore[attr-defined]
        return r[:4] + r[6:8] + (kinds,) + r[9:]

    assert fewer[1] and not fewer[7]  # complete, every fault fired
    assert but_ticks(fewer) == but_ticks(every)
    assert fewer[8]["tick"] < every[8]["tick"] / 2, (fewer[8]["tick"], every[8]["tick"])  # type: ignore[index]


def test_a_round_progress_made_fast_is_the_constructed_one() -> None:
    """sim/progress.new_progress fills the record's slots by hand: it must be what the constructor
    makes, with fresh lists each time, and must know every field (a field added later fails here)."""
    from dataclasses import fields

    from sim.progress import Progress, new_progress

    assert [f.name for f in fields(Progress)] == ["round", "cursor", "steps_h", "keep_of", "done", "epochs", "lazy"]
    for keep_of in (None, ("cfg", 3, 1, 0, 96)):
        fast, slow = new_progress(4, 96, 8, keep_of), Progress(4, 96, 8, keep_of)
        assert type(fast) is Progress and fast == slow and repr(fast) == repr(slow)
    a, b = new_progress(1, 0, 8, None), new_progress(1, 0, 8, None)
    a.done.append((range(0, 8), 0))
    assert b.done == [] and a.epochs is not b.epochs


def test_a_wall_budget_stops_a_large_run_even_when_its_messages_arrive_in_batches() -> None:
    """`wall_stop` is polled every 4,096 clock entries: 200 sites' same-instant heartbeats and round
    reports run as batches, and the budget must still be looked at (here: spent at the first look)."""
    sites = [f"s{i:03d}" for i in range(200)]
    cfg = load_config({"cluster": {"sites": sites}, "train": {"target_useful_tokens": 10 ** 12}})
    looks: list[int] = []
    res = simulate(cfg, None, SimModel(), max_sim_s=3600, wall_stop=lambda: looks.append(1) is None)
    assert looks == [1] and not res.complete and res.sim_s < 600


def test_calibrating_on_a_simulated_run_recovers_its_timing_model(tmp_path: Path) -> None:
    """The round trip: fit sim/calibrate.py to a run the simulator wrote with known parameters."""
    truth = SimModel(compute_s_per_token=0.0007, eval_s=2.5, restart_s=12.0, fault_poll_s=0.8,
                     collective_cpu_s=0.05, crash_teardown_s=0.07)
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    simulate(cfg_for("restart"), scen, truth, out=tmp_path / "run")
    cal = tmp_path / "cal.json"
    assert sim_main(["calibrate", str(tmp_path / "run"), "--out", str(cal), "--allow-simulated"]) == 0
    doc = json.loads(cal.read_text())
    p = doc["parameters"]
    assert p["compute_s_per_token"]["value"] == pytest.approx(0.0007, rel=1e-6)
    assert p["eval_s"]["value"] == pytest.approx(2.5, rel=1e-6)
    assert p["fault_poll_s"]["value"] == pytest.approx(0.8, rel=1e-6)  # to the SIGKILL, not to the exit
    assert p["crash_teardown_s"]["value"] == pytest.approx(0.07, rel=1e-6)
    assert p["collective_cpu_s"]["value"] == pytest.approx(0.05, abs=1e-6)
    # restart: the modeled restart plus the join's trip to the coordinator (service link latency)
    assert 12.0 <= p["restart_s"]["value"] <= 12.1
    assert all(v["source_runs"] == ["run"] and v["evidence"] == "fitted" for v in p.values())
    assert set(doc["inputs"][0]["sha256"]) >= {"config.json", "logs/coord.jsonl", "logs/b.jsonl"}
    fitted = SimModel.from_calibration(doc)
    assert fitted.compute_s_per_token == pytest.approx(0.0007) and fitted.evidence_of("eval_s") == "fitted"
    assert fitted.evidence_of("update_cosine") == "prior"


def test_calibrating_an_elastic_run_separates_the_round_ends_fixed_and_per_peer_parts(tmp_path: Path) -> None:
    """An elastic run with a crash has rounds of two members (one peer) and of three (two peers): the
    fit recovers the round's end, fixed part and per-peer part, and the donor's state transfer's fixed
    cost, from a simulated run with known values."""
    truth = SimModel(collective_cpu_s=0.01, collective_per_peer_s=0.02, state_transfer_fixed_s=0.05, restart_s=2.0)
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=6)
    simulate(cfg_for("elastic"), scen, truth, out=tmp_path / "run")
    p = calibrate([tmp_path / "run"], allow_simulated=True)["parameters"]
    rounds = p["collective_cpu_s"]["by_peers"]
    assert set(rounds) == {"1", "2"} and min(r["rounds"] for r in rounds.values()) >= ROUND_END_MIN
    assert p["collective_cpu_s"]["value"] == pytest.approx(0.01, abs=1e-6)
    assert p["collective_per_peer_s"]["value"] == pytest.approx(0.02, abs=1e-6)
    assert p["state_transfer_fixed_s"]["value"] == pytest.approx(0.05, abs=1e-6)
    fitted = SimModel.from_calibration({"parameters": p})
    assert collective_end_s(fitted, 3) == pytest.approx(0.05, abs=1e-6)  # 10 ms + two peers x 20 ms
    # a negative intercept (inside a fit's uncertainty) never makes a round's end negative
    assert collective_end_s(SimModel(collective_cpu_s=-0.01, collective_per_peer_s=0.02), 1) == 0.0


def test_one_peer_count_gives_the_round_end_one_median_and_no_per_peer_part() -> None:
    """Rounds of one member count only: the line is not determined, so the fixed part is their median
    and the per-peer part stays the prior (left out of the fit), with the reason in its uncertainty."""
    got = round_end_fit([((2, y), "r") for y in (0.030, 0.040, 0.050)] + [((1, 0.020), "r")])
    assert set(got) == {"collective_cpu_s"} and got["collective_cpu_s"]["value"] == pytest.approx(0.035)
    assert "too few counts" in got["collective_cpu_s"]["uncertainty"]["kind"]


def test_calibrate_refuses_what_is_not_an_emulator_run_and_reads_a_moved_comparison(tmp_path: Path, capsys) -> None:
    """Bad input is a clear error (exit 2), never a traceback: a missing directory, a directory that is
    neither a run nor a comparison, a simulated run (without --allow-simulated). A comparison
    directory stands for its policy runs, found beside its index.json even after it was moved."""
    sim_run = tmp_path / "simulated"
    simulate(cfg_for("restart"), None, SimModel(), out=sim_run)
    cal = tmp_path / "cal.json"
    for args, says in (([str(tmp_path / "nope")], "no such directory"),
                       ([str(tmp_path)], "neither an emulator run directory"),
                       ([str(sim_run)], "a simulated run (sim.json)")):
        assert sim_main(["calibrate", *args, "--out", str(cal)]) == 2
        assert says in capsys.readouterr().err
    assert not cal.exists()
    # A comparison written elsewhere (index.json names absolute paths that no longer exist).
    cmp_dir = tmp_path / "moved"
    for pol in ("stall", "elastic"):
        simulate(cfg_for(pol), None, SimModel(), out=cmp_dir / f"{pol}-1")
    (cmp_dir / "index.json").write_text(json.dumps({"runs": [{"policy": "stall", "run_dir": "/gone/stall-1"},
                                                             {"policy": "elastic", "run_dir": "elastic-1"}]}))
    # A run named on its own and through its comparison counts once.
    assert sim_main(["calibrate", str(cmp_dir), str(cmp_dir / "stall-1"), "--out", str(cal), "--allow-simulated"]) == 0
    doc = json.loads(cal.read_text())
    assert [Path(i["run"]).name for i in doc["inputs"]] == ["stall-1", "elastic-1"]
    assert all(i["simulated"] for i in doc["inputs"])
    assert doc["parameters"]["compute_s_per_token"]["source_runs"] == ["elastic-1", "stall-1"]


def test_a_bad_calibration_file_or_site_count_is_a_clear_error_not_the_prior(tmp_path: Path, capsys) -> None:
    """A calibration file that is missing, not JSON, or not one `xdc sim calibrate` wrote stops the run
    (exit 2) with the reason: read as "nothing fitted" it would have run on the prior unannounced."""
    (tmp_path / "notjson.json").write_text("{")
    (tmp_path / "other.json").write_text('{"x": 1}')
    (tmp_path / "badvalue.json").write_text('{"version": "xdc-sim-calibration-v1", "parameters": {"eval_s": {}}}')
    for name, says in (("missing.json", "cannot read the calibration file"), ("notjson.json", "not JSON"),
                       ("other.json", "not a calibration file (version None"),
                       ("badvalue.json", "parameter 'eval_s' has no numeric `value`")):
        out = tmp_path / f"run-{name}"
        assert sim_main(["run", "none", "--sites", "3", "--out", str(out), "--calibration", str(tmp_path / name)]) == 2
        assert says in capsys.readouterr().err, name
        assert not out.exists()
    assert sim_main(["run", "none", "--sites", "-2", "--out", str(tmp_path / "neg")]) == 2
    assert "--sites must be at least 1" in capsys.readouterr().err


def test_sim_report_refuses_a_missing_directory_and_simulated_runs(tmp_path: Path, capsys) -> None:
    """`xdc sim report` compares the simulator with the emulator: simulated runs in its "measured"
    column would compare the simulator with itself. Both are refused (exit 2) before anything is written."""
    simulate(cfg_for("restart"), None, SimModel(), out=tmp_path / "simulated")
    for src, says in ((tmp_path / "nope", "no such directory"), (tmp_path / "simulated", "simulated runs (simulated")):
        assert sim_main(["report", str(src), "--out", str(tmp_path / "rep")]) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_calibration_fits_the_time_from_a_preemption_notice_to_its_announcement(tmp_path: Path) -> None:
    """preempt_exit_s round trip: SIGTERM (`signal`) -> `preemption_announced` in the preempted site's
    log. Its prior (0.2 s) was 2-30x the emulator's 0.006-0.086 s (the agent checks between inner steps),
    so the simulated survivors took more steps of the round the notice voids (churn: 5,120 tokens lost
    against the emulator's 3,072-4,864)."""
    truth = SimModel(preempt_exit_s=0.07)
    scen = Scenario.build("t", "").preempt("c", grace_s=1, return_after_s=2, at_useful_tokens=36_864)
    simulate(cfg_for("stall"), scen, truth, out=tmp_path / "run")
    cal = tmp_path / "cal.json"
    assert sim_main(["calibrate", str(tmp_path / "run"), "--out", str(cal), "--allow-simulated"]) == 0
    p = json.loads(cal.read_text())["parameters"]
    assert p["preempt_exit_s"]["value"] == pytest.approx(0.07, abs=1e-6)
    assert p["preempt_exit_s"]["n"] == 1 and p["preempt_exit_s"]["source_runs"] == ["run"]


def test_the_adaptive_controller_answers_a_simulated_bandwidth_collapse(tmp_path: Path) -> None:
    """control/controller.py through the core, on scenarios/bandwidth-collapse.yaml: a larger H or
    compression while a<->b is at 200 KB/s, and back to a cheaper-to-communicate-less setting after."""
    out = tmp_path / "bw"
    assert sim_main(["run", str(ROOT / "scenarios" / "bandwidth-collapse.yaml"), "--sites", "3", "--policy",
                     "elastic", "--out", str(out), "--set", "train.target_useful_tokens=1179648",
                     "--set", "train.mode=adaptive"]) == 0
    chaos = {e["event"]: e["mono_ns"] for e in map(json.loads, (out / "logs" / "chaos.jsonl").read_text().splitlines())}
    changes = [e for e in map(json.loads, (out / "logs" / "coord.jsonl").read_text().splitlines())
               if e["event"] == "setting_changed"]
    during = [c["new"] for c in changes if chaos["fault_injected"] < c["mono_ns"] < chaos["fault_healed"]]
    after = [c["new"] for c in changes if c["mono_ns"] > chaos["fault_healed"]]
    assert any(s["inner_steps_h"] >= 16 or s["compression"] != "none" for s in during), during
    assert after and after[-1]["compression"] == "none" and after[-1]["inner_steps_h"] <= 8, after
    status = {c["name"]: c["status"] for c in build_artifact([out])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"  # one run
    assert set(status.values()) == {"pass"}, status


def test_every_event_a_simulated_run_writes_is_in_the_registry(tmp_path: Path) -> None:
    from ground.eventlog import read_events
    from ground.events import EVENTS

    scen = Scenario.build("t", "").preempt("c", grace_s=1, return_after_s=2, at_useful_tokens=36_864)
    simulate(cfg_for("restart"), scen, out=tmp_path / "run")
    seen = {e["event"] for log in (tmp_path / "run" / "logs").glob("*.jsonl") for e in read_events(log)}
    assert {"commit", "membership_epoch", "fault_injected", "coord_input", "round_done", "work_attempted",
            "checkpoint_durable", "preemption_announced"} <= seen
    assert not sorted(seen - set(EVENTS)), "events the registry (ground/events.py) lacks"


def test_step_all_is_a_fold_of_step_on_a_simulated_runs_inputs(tmp_path: Path) -> None:
    """coordinator.core.step_all (one working copy for one instant's messages, the simulator's batch)
    gives the states and outputs that one core.step per input gives, on every instant of a 12-site
    run with a crash, a restart and a preemption under elastic; and leaves its input state untouched."""
    from coordinator import core
    from ground.eventlog import read_events

    sites = [f"s{i:02d}" for i in range(12)]
    cfg = load_config(merge(COMPARE_CFG, {"run_id": "fold", "cluster": {"sites": sites},
                                         "recovery": {"policy": "elastic"}}))
    scen = Scenario.build("t", "").crash("s03", at_useful_tokens=36_864, restart_after_s=2) \
        .preempt("s07", grace_s=1, return_after_s=2, at_useful_tokens=150_000)
    simulate(cfg, scen, out=tmp_path / "run")
    inputs = [e for e in read_events(tmp_path / "run" / "logs" / "coord.jsonl") if e["event"] == "coord_input"]
    groups: list[list[dict]] = []
    for e in inputs:  # runs of messages at one instant (as the simulator batches them); a tick alone
        if groups and e["input"] == "message" and groups[-1][0]["input"] == "message" \
                and groups[-1][0]["now_ns"] == e["now_ns"]:
            groups[-1].append(e)
        else:
            groups.append([e])

    def event_of(e: dict) -> core.Received | core.Tick:
        if e["input"] == "tick":
            return core.Tick(tuple(sorted((k, int(v)) for k, v in e["lost"].items())))
        body = e.get("body", "rejected: body not logged")  # a rejected one is rejected again
        return core.Received(e["src"], e["inc"], e["msg_epoch"], e["kind"], body)

    folded = batched = core.initial_state(cfg)
    sizes = []
    for g in groups:
        events, now = [event_of(e) for e in g], g[0]["now_ns"]
        want = []
        for ev in events:
            folded, out = core.step(folded, ev, now, cfg)
            want.append(out)
        before = (batched.membership, dict(batched.reports), batched.commits, batched.settings.copy())
        new, got = core.step_all(batched, events, now, cfg)
        assert (batched.membership, dict(batched.reports), batched.commits, batched.settings) == before
        assert got == want and new == folded, g[0]["id"]
        batched = new
        sizes.append(len(events))
    assert max(sizes) >= 12 and folded.commits and len(inputs) > 400  # real batches: every member at once


def test_survivors_keep_their_steps_of_the_round_in_flight_as_the_emulators_sites_do(tmp_path: Path) -> None:
    """Plan.carry in the simulator (sim/rounds.py), as tests/live/test_carry_live.py checks it on real sites:
    b is SIGKILLed during its 4th inner step of round 2 while a and c have taken their 4 and wait in
    the collective; elastic's two survivors take round 2 over and keep the steps the carried layout
    asks of them (a keeps 3, c keeps 2), log them as `work_carried`, and redo only the rest. Lost:
    b's 3 finished steps (a killed site never logs the step it was in, as site_agent/rounds.py logs
    `work_attempted` after a step) and the survivors' dropped ones (a 1, c 2), 6 steps of 8 samples
    of 128 tokens."""
    from ground.eventlog import process_events

    out = tmp_path / "run"
    simulate(cfg_for("elastic"), Scenario.build("t", "").crash("b", at_s=6.0, restart_after_s=2), out=out)
    carried = {s: [(e["round"], e["inner_step"], e["from_epoch"], e["epoch"]) for e in process_events(out, s)
                   if e["event"] == "work_carried"] for s in "abc"}
    assert carried == {"a": [(2, 0, 1, 2), (2, 1, 1, 2), (2, 2, 1, 2)], "b": [], "c": [(2, 0, 1, 2), (2, 1, 1, 2)]}
    restores = {s: next(e for e in process_events(out, s) if e["event"] == "restore" and e["epoch"] == 2)
                for s in "ac"}
    assert {s: (r["carried_steps"], r["dropped_steps"], r["rolled_back"]) for s, r in restores.items()} == \
        {"a": (3, 1, False), "c": (2, 2, False)}
    redone = {s: [e["inner_step"] for e in process_events(out, s) if e["event"] == "work_attempted"
                  and e["epoch"] == 2 and e["round"] == 2] for s in "ac"}
    assert redone == {"a": [3], "c": [2, 3]}  # only the steps not kept
    b_steps = [e["inner_step"] for e in process_events(out, "b") if e["event"] == "work_attempted" and e["round"] == 2]
    assert b_steps == [0, 1, 2]  # the 4th was cut short by the SIGKILL
    art = build_artifact([out])
    assert art["runs"][0]["metrics"]["lost_tokens"]["value"] == (3 + 1 + 2) * 8 * 128
    status = {c["name"]: c["status"] for c in art["checks"]}
    assert status["work_ledger"] == "pass" and status["lineage"] == "pass", status


def test_a_hang_shorter_than_the_heartbeat_timeout_only_delays_and_a_longer_one_fails_the_site(tmp_path: Path) -> None:
    """site_hang (SIGSTOP, heal SIGCONT) on the virtual clock: b stops 5 s after the first epoch.
    For 1 s (under the 2 s heartbeat timeout) nobody fails and the run ends exactly 1 s later than
    without the fault: b's compute, timers and heartbeats waited, the others waited for b in the
    collective. For 6 s the coordinator fails b 2 s after its last heartbeat; when it continues, b
    finds it is no longer a member and rejoins; the ledger balances."""
    from ground.eventlog import process_events

    base = simulate(cfg_for("elastic"), None, out=tmp_path / "none")
    short = simulate(cfg_for("elastic"), Scenario.build("t", "").hang("b", at_s=5.0, duration_s=1.0),
                     out=tmp_path / "short")
    assert short.complete and short.epochs == 1 and short.sim_s == pytest.approx(base.sim_s + 1.0, abs=1e-6)
    long = simulate(cfg_for("elastic"), Scenario.build("t", "").hang("b", at_s=5.0, duration_s=6.0),
                    out=tmp_path / "long")
    assert long.complete and long.epochs == 3
    coord = process_events(tmp_path / "long", "coord")
    stop = next(e for e in process_events(tmp_path / "long", "chaos") if e["event"] == "fault_injected")
    assert stop["result"]["signal"] == "SIGSTOP"
    beats = [e["mono_ns"] for e in coord if e["event"] == "coord_input" and e.get("kind") == "heartbeat"
             and e.get("src") == "b" and e["mono_ns"] <= stop["mono_ns"]]
    failed = next(e for e in coord if e["event"] == "site_failed")
    assert failed["site"] == "b" and "no heartbeat after 2000 ms" in failed["reason"]
    assert 2.0 <= (failed["mono_ns"] - max(beats)) / 1e9 <= 2.1
    b = process_events(tmp_path / "long", "b")
    back = next(e for e in b if e["event"] == "not_a_member")
    assert back["mono_ns"] == stop["mono_ns"] + 6 * 10**9  # it learns of epoch 2 only when it continues
    assert [e["members"] for e in b if e["event"] == "membership"][-1] == ["a", "b", "c"]
    status = {c["name"]: c["status"] for c in build_artifact([tmp_path / "long"])["checks"]}
    assert status["work_ledger"] == "pass" and status["lineage"] == "pass" and status["fencing"] == "pass", status


@pytest.mark.parametrize("mode", ["stop", "kill"])
def test_a_store_outage_holds_uploads_and_restores_until_the_store_is_back(tmp_path: Path, mode: str) -> None:
    """store_outage from 4 s to 14 s after the first epoch, and b crashes at 6 s (restart policy: the
    cluster restores from the store). No upload becomes durable and no restore reads while the
    store is out; after it is back (at once for a stop, `store_restart_s` later for a kill) they
    finish and the run completes with every checker passing."""
    from ground.eventlog import process_events

    sc = Scenario.build("t", "").store_outage(at_s=4.0, duration_s=10.0, mode=mode).crash("b", at_s=6.0,
                                                                                            restart_after_s=2)
    out = tmp_path / mode
    res = simulate(cfg_for("restart"), sc, out=out)
    assert res.complete
    chaos = {e["event"]: e for e in process_events(out, "chaos") if e["event"] in ("fault_injected", "fault_healed")
             and e["kind"] == "store_outage"}
    back = chaos["fault_healed"]["mono_ns"] + (10**9 if mode == "kill" else 0)  # SimModel.store_restart_s = 1.0
    durable = [e["mono_ns"] for e in process_events(out, "store") if e["event"] == "checkpoint_durable"]
    assert durable and not [t for t in durable if chaos["fault_injected"]["mono_ns"] < t < back]
    loads = [e for s in "abc" for e in process_events(out, s) if e["event"] == "checkpoint_load"]
    restores = [e for s in "abc" for e in process_events(out, s) if e["event"] == "restore" and e.get("source") == "store"]
    assert loads and restores and all(e["mono_ns"] >= back for e in restores)
    if mode == "kill":
        assert len([e for e in process_events(out, "store") if e["event"] == "store_started"]) == 2
    status = {c["name"]: c["status"] for c in build_artifact([out])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"
    assert set(status.values()) == {"pass"}, status


def test_a_coordinator_crash_recovers_from_its_journal_and_a_site_lost_meanwhile_fails_after_it(tmp_path: Path) -> None:
    """coord_crash 5 s after the first epoch, restarted 3 s later (+ coord_restart_s 1.5 s); b is
    killed while the coordinator is down. The restarted coordinator rebuilds its state with the
    core's own `recover` from the journal (the commits made before the crash), announces the epoch
    again, receives what the sites queued meanwhile, and fails b only when b's heartbeat is
    overdue counting from the restart (it never saw b's connection close). Every checker passes."""
    from ground.eventlog import process_events

    sc = Scenario.build("t", "").coord_crash(at_s=5.0, restart_after_s=3.0).crash("b", at_s=6.0, restart_after_s=2)
    out = tmp_path / "run"
    res = simulate(cfg_for("elastic"), sc, out=out)
    assert res.complete and res.epochs == 3
    coord = process_events(out, "coord")
    rec = next(e for e in coord if e["event"] == "coordinator_recovered")
    started = [e for e in coord if e["event"] == "coordinator_started"]
    assert len(started) == 2 and started[1]["journal_commits"] == rec["commits"] > 0
    failed = next(e for e in coord if e["event"] == "site_failed")
    assert failed["site"] == "b" and "no heartbeat after 2000 ms" in failed["reason"]
    assert (failed["mono_ns"] - started[1]["mono_ns"]) / 1e9 == pytest.approx(2.0, abs=0.05)
    status = {c["name"]: c["status"] for c in build_artifact([out])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"
    assert set(status.values()) == {"pass"}, status


@pytest.mark.parametrize("policy", ["stall", "elastic"])
def test_a_site_restarted_while_the_coordinator_is_down_skips_the_re_announced_epoch(tmp_path: Path,
                                                                                     policy: str) -> None:
    """Soak seed 1008 on the virtual clock: the coordinator crashes right after the first commits and
    stays down 12 s; b is killed meanwhile and its new process is up before the coordinator is. The
    recovered coordinator re-announces epoch 1, which names b's first incarnation: the new b skips
    it (as the agent does) and trains only in an epoch formed after its join. Every checker passes
    (before the fix the new b retrained a committed round under it)."""
    from ground.eventlog import process_events

    sc = Scenario.build("t", "").coord_crash(at_s=5.0, restart_after_s=12.0).crash("b", at_s=6.0, restart_after_s=1)
    out = tmp_path / "run"
    res = simulate(cfg_for(policy), sc, model=SimModel(restart_s=2.0), out=out)
    assert res.complete
    b = process_events(out, "b")
    second = [e for e in b if e["pid"] != b[0]["pid"]]
    started = next(e for e in second if e["event"] == "site_started")
    recovered = next(e for e in process_events(out, "coord") if e["event"] == "coordinator_recovered")
    assert started["mono_ns"] < recovered["mono_ns"]  # the new b was up before the coordinator
    skipped = [e for e in second if e["event"] == "membership_skipped"]
    assert [e["skipped_epoch"] for e in skipped] == [1] and "made for incarnation 1 of b" in skipped[0]["reason"]
    assert all(e["epoch"] > 1 for e in second if e["event"] in ("membership", "work_attempted"))
    status = {c["name"]: c["status"] for c in build_artifact([out])["checks"]}
    assert status.pop("byte_classes") == "unknown" and status.pop("same_frontier") == "unknown"
    assert set(status.values()) == {"pass"}, status


def test_a_joiner_finishes_its_transfer_when_a_drain_from_a_later_round_arrives(tmp_path: Path) -> None:
    """Churn under oracle (make sim-validate's settings, restarts of 2 s): b rejoins by transfer at
    round 8 (epoch 3); before its state arrives, the oracle drains c from round 9 (epoch 4, restore
    none). b needs round 8's state and round 8 itself for epoch 4: it must finish the transfer, not
    abandon it. It used to abandon it (as the emulator's agent did), fail epoch 4's restore, be
    declared failed, and the run took seven epochs instead of five."""
    from chaos.policy_config import config_for_policy as with_policy

    cfg = load_config({"run_id": "churn-oracle", "model": {"n_layers": 2},
                       "train": {"target_useful_tokens": 589_824, "step_floor_ms": 100, "per_site_batch": 2,
                                 "inner_steps_h": 32, "checkpoint_every_rounds": 4, "eval_every_rounds": 6,
                                 "lr_warmup_tokens": 65_536},
                       "wan": {"site_link": {"up": {"bandwidth_kbps": 5000}, "down": {"bandwidth_kbps": 5000}}}})
    scen = load_scenario(ROOT / "scenarios" / "churn.yaml", cfg.cluster.sites)
    out = tmp_path / "run"
    simulate(with_policy(cfg, "oracle", scen), scen, SimModel(restart_s=2.0), out=out, max_sim_s=400)
    coord = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (out / "logs" / "b.jsonl").read_text().splitlines()]
    epochs = [(e["epoch"], e["start_round"], e["members"], e["restore"]) for e in coord
              if e["event"] == "membership_epoch"]
    # The case: a rejoin by transfer, then a drain from the next round before the transfer is done.
    rejoin = next(i for i, ep in enumerate(epochs) if ep[3] == "donor" and "b" in ep[2])
    assert epochs[rejoin + 1][1] == epochs[rejoin][1] + 1 and epochs[rejoin + 1][3] == "none"
    assert [e["event"] for e in b if e["event"] in ("restore_abandoned", "restore_failed")] == []
    received = [e for e in b if e["event"] == "state_received"]
    assert [e["epoch"] for e in received] == [epochs[rejoin][0]]
    trained = {(e["epoch"], e["round"]) for e in b if e["event"] == "round_done"}
    assert (epochs[rejoin][0], epochs[rejoin][1]) in trained  # round 8, in the rejoin's epoch
    assert len(epochs) == 5
    status = {c["name"]: c["status"] for c in analyze([out], report=False).artifact["checks"]}
    # No Toxiproxy counters in a simulation, and one run has no other run's frontier to compare with.
    assert (status.pop("byte_classes"), status.pop("same_frontier")) == ("unknown", "unknown")
    assert set(status.values()) == {"pass"}, status


def test_a_killed_sites_connections_close_when_it_has_exited_not_at_the_kill(tmp_path: Path) -> None:
    """crash_teardown_s: the compute stops at the SIGKILL (the same work is lost), but the coordinator
    sees the connection close, and starts its disconnect grace, only once the process has exited:
    the site is declared failed exactly the teardown later."""
    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)

    def run(teardown_s: float) -> tuple[dict, dict, list[dict]]:
        out = tmp_path / f"t{teardown_s}"
        simulate(cfg_for("stall"), scen, SimModel(crash_teardown_s=teardown_s), out=out)
        chaos = [json.loads(x) for x in (out / "logs" / "chaos.jsonl").read_text().splitlines()]
        coord = [json.loads(x) for x in (out / "logs" / "coord.jsonl").read_text().splitlines()]
        b = [json.loads(x) for x in (out / "logs" / "b.jsonl").read_text().splitlines()]
        fault = next(e for e in chaos if e["event"] == "fault_injected")
        failed = next(e for e in coord if e["event"] == "site_failed")
        return fault, failed, [e for e in b if e["event"] == "work_attempted" and e["mono_ns"] <= fault["mono_ns"]]

    f0, failed0, work0 = run(0.0)
    f1, failed1, work1 = run(0.25)
    assert f0["mono_ns"] == f1["mono_ns"] and "start_mono_ns" not in f0
    assert (f1["start_mono_ns"], f1["end_mono_ns"]) == (f1["mono_ns"], f1["mono_ns"] + 250_000_000)
    assert failed1["mono_ns"] - failed0["mono_ns"] == 250_000_000
    assert work0 and [(e["round"], e["inner_step"]) for e in work0] == [(e["round"], e["inner_step"]) for e in work1]


def test_a_fault_gate_holds_every_site_until_the_crash_so_lost_work_does_not_depend_on_the_drivers_delay(
        tmp_path: Path) -> None:
    """Fault gates in the simulator (sim/rounds.py `gate`, as site_agent/rounds.py waits): after the
    round whose commit fires b's crash, a and c wait until the driver's action is done (the SIGKILL
    and b's exit), b is killed while it waits, and nobody takes a step of the next round before. So
    the lost tokens are the same whatever the driver's reaction (fault_poll_s); without gates they
    are not: the sites go on stepping while the driver reacts."""
    from ground.eventlog import process_events

    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)

    def run(poll_s: float, gated: bool) -> tuple[int, list, dict]:
        out = tmp_path / f"p{poll_s}-{gated}"
        cfg = cfg_for("stall")
        if gated:
            cfg = replace(cfg, recovery=replace(cfg.recovery, fault_gates=(36_864,)))
        simulate(cfg, scen, SimModel(fault_poll_s=poll_s, crash_teardown_s=0.07), out=out)
        fault = next(e for e in process_events(out, "chaos") if e["event"] == "fault_injected")
        commit = next(e for e in process_events(out, "coord") if e["event"] == "commit"
                      and e["useful_tokens"] >= 36_864)
        early = {s: [e["inner_step"] for e in process_events(out, s) if e["event"] == "work_attempted"
                     and e["epoch"] == commit["epoch"] and e["round"] == commit["round"] + 1
                     and e["mono_ns"] <= fault["end_mono_ns"]] for s in "abc"}
        gates = {s: [(e["round"], e["gate_tokens"], e["outcome"], e["waited_s"]) for e in process_events(out, s)
                     if e["event"] == "fault_gate"] for s in "abc"}
        released = [e for e in process_events(out, "chaos") if e["event"] == "fault_gate_released"]
        art = build_artifact([out])
        assert {c["name"]: c["status"] for c in art["checks"]}["work_ledger"] == "pass"
        return art["runs"][0]["metrics"]["lost_tokens"]["value"], [early, gates, released, fault], commit

    lost_fast, (early, gates, released, fault), commit = run(0.05, True)
    lost_slow, (early_slow, gates_slow, _r, _f), _c = run(0.3, True)
    assert early == early_slow == {"a": [], "b": [], "c": []}
    assert lost_fast == lost_slow
    r = commit["round"]
    assert gates["b"] == [] and gates_slow["b"] == []  # killed while it waited
    assert [g[:3] for g in gates["a"]] == [g[:3] for g in gates["c"]] == [(r, 36_864, "released")]
    assert [e["mono_ns"] for e in released] == [fault["end_mono_ns"]]
    assert gates_slow["a"][0][3] - gates["a"][0][3] == pytest.approx(0.25, abs=1e-6)  # the longer reaction, waited
    lost_ungated, (_e, gates_ungated, _r, _f), _c = run(0.3, False)
    assert gates_ungated == {"a": [], "b": [], "c": []}
    assert (lost_fast, lost_ungated) == (2048, 4096)  # b's first step of the next round, a's and c's


def test_a_site_preempted_while_it_waits_at_a_fault_gate_announces_at_once(tmp_path: Path) -> None:
    """Between inner steps the agent notices a SIGTERM at its next check (preempt_exit_s, a step at
    most); waiting at a fault gate it looks for it every ground.gates.POLL_S, so it announces then."""
    from ground import gates
    from ground.eventlog import process_events

    scen = Scenario.build("t", "").preempt("b", at_useful_tokens=36_864)

    def announce_after_s(gated: bool) -> float:
        out = tmp_path / f"g{gated}"
        cfg = cfg_for("elastic")
        if gated:
            cfg = replace(cfg, recovery=replace(cfg.recovery, fault_gates=(36_864,)))
        simulate(cfg, scen, SimModel(fault_poll_s=0.05, preempt_exit_s=0.2), out=out)
        b = process_events(out, "b")
        sig = next(e for e in b if e["event"] == "signal")
        return (next(e for e in b if e["event"] == "preemption_announced")["mono_ns"] - sig["mono_ns"]) / 1e9

    assert announce_after_s(True) == pytest.approx(gates.POLL_S, abs=1e-9)
    assert announce_after_s(False) == pytest.approx(0.2, abs=1e-9)
    left = [e for e in process_events(tmp_path / "gTrue", "b") if e["event"] in ("signal", "fault_gate")]
    assert [(e["event"], e.get("outcome")) for e in left] == [("signal", None), ("fault_gate", "left")]
    # The calibration's preempt_exit_s is the notice between inner steps: a gated one is left out.
    fit = {g: calibrate([tmp_path / f"g{g}"], allow_simulated=True)["parameters"].get("preempt_exit_s") for g in
           (True, False)}
    assert fit[True] is None and fit[False]["value"] == pytest.approx(0.2, abs=1e-9)


def test_the_oracles_sites_leave_a_fault_gate_at_once_as_its_drain_waits(tmp_path: Path) -> None:
    """As on the emulator's sites (tests/live/test_recovery_policies.py): the oracle's drain of b is planned
    for the round after the triggering commit, so a, b and c find a newer epoch waiting at the gate
    and leave it without waiting."""
    from ground.eventlog import process_events
    from chaos.policy_config import config_for_policy as with_policy

    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    cfg = with_policy(cfg_for("oracle"), "oracle", scen)
    assert cfg.recovery.fault_gates == (36_864,) and cfg.recovery.oracle_faults == (("b", 36_864),)
    out = tmp_path / "oracle"
    simulate(cfg, scen, SimModel(fault_poll_s=0.05), out=out)
    commit = next(e for e in process_events(out, "coord") if e["event"] == "commit" and e["useful_tokens"] >= 36_864)
    gates = {s: [(e["round"], e["outcome"], e["waited_s"]) for e in process_events(out, s)
                 if e["event"] == "fault_gate"] for s in "abc"}
    assert {s: g[:1] for s, g in gates.items()} == {s: [(commit["round"], "left", 0.0)] for s in "abc"}


def test_a_killed_sites_connection_closes_before_the_driver_sees_it_exit_and_calibrate_recovers_both(
        tmp_path: Path) -> None:
    """crash_close_s: the coordinator sees the connection close (and starts its disconnect grace) at
    SIGKILL + crash_close_s, while the driver's action (and a fault gate's release) ends at SIGKILL +
    crash_teardown_s, as on the emulator (close 37-44 ms, exit seen 64-68 ms). Calibration fits both."""
    from ground.eventlog import process_events

    scen = Scenario.build("t", "").crash("b", at_useful_tokens=36_864, restart_after_s=2)
    out = tmp_path / "run"
    simulate(cfg_for("stall"), scen, SimModel(crash_teardown_s=0.065, crash_close_s=0.04), out=out)
    fault = next(e for e in process_events(out, "chaos") if e["event"] == "fault_injected")
    closed = next(e for e in process_events(out, "coord") if e["event"] == "peer_disconnected")
    assert closed["mono_ns"] - fault["start_mono_ns"] == 45_000_000  # and the service link's 5 ms
    assert fault["end_mono_ns"] - fault["start_mono_ns"] == 65_000_000
    p = calibrate([out], allow_simulated=True)["parameters"]
    assert p["crash_close_s"]["value"] == pytest.approx(0.04, abs=1e-9)
    assert p["crash_teardown_s"]["value"] == pytest.approx(0.065, abs=1e-9)
