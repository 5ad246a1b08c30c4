"""One simulated run: the clock, the processes, the links between them, and its run directory.

`simulate(cfg, scenario, model, out)` builds the world, runs it on the virtual clock until the
coordinator's shutdown (or `max_sim_s`), and returns a `SimResult`. With `out`, the run
directory has the emulator's layout: config.json (the RunConfig), scenario.json, sim.json (the
manifest that marks it simulated, with the model and its evidence), coordinator/journal.jsonl
and logs/<process>.jsonl with the emulator's event records.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from chaos.scenario import Scenario
from ground.config import RunConfig, save_config
from ground.plans import EpochPlan
from ground.schedule import target_samples
from ground.setting import ConsistencySetting, effective_config
from sim.coord import SimCoordinator
from sim.engine import Clock, NullLog, SimLog, few_collections, ns
from sim.faults import SimChaos, check_supported
from sim.links import Links
from sim.learning_fit import LearningCurve
from sim.model import SimModel, flops_per_token, link_one_way_s, n_params
from sim.standby import StandbyPool
from sim.rounds import Rounds
from sim.services import Heartbeats, Learning, SimStore
from sim.site import SimSite, chain
from sim.wan_bytes import WanTally

MANIFEST = "sim.json"
PROCESS_PIDS = {"coord": 11, "store": 12, "chaos": 13, "launcher": 14}


@dataclass
class SimResult:
    run_dir: Path | None
    sim_s: float
    complete: bool
    commits: int
    epochs: int
    core_steps: int
    events_run: int
    useful_tokens: int
    core_s: float = 0.0  # wall seconds inside coordinator.core.step
    core_by_kind: dict[str, tuple[int, float]] = field(default_factory=dict)  # kind -> (inputs, wall s in the core)
    never_fired: list[str] = field(default_factory=list)  # the scenario's faults never injected (SimChaos.never_fired)


class World:
    def __init__(self, cfg: RunConfig, scenario: Scenario | None, model: SimModel, run_dir: Path | None) -> None:
        self.cfg, self.model, self.run_dir = cfg, model, run_dir
        self.write_logs = run_dir is not None
        self.clock = Clock()
        self.logs: dict[str, Any] = {}
        self.target = target_samples(cfg)
        self.n_params, self.flops_per_token = n_params(cfg.model), flops_per_token(cfg.model)
        self._sha: dict[int, str] = {}
        self.transfers: dict[tuple[int, str], tuple[str, int, int]] = {}
        self.evaluated_initial = False
        self._plans: dict[tuple[int, int], tuple[dict[str, Any], EpochPlan]] = {}
        self._effective: dict[ConsistencySetting, RunConfig] = {}
        self._applied: tuple[tuple[str, int, int, int] | None, str] = (None, "")  # apply_round's last
        self._index: dict[int, tuple[tuple[str, ...], dict[str, int]]] = {}
        self.site_set = frozenset(cfg.cluster.sites)
        self.decisions: list[dict[str, Any]] = []
        self.links = Links(cfg, model)
        self.held: list[tuple[tuple[str, str], Any, tuple[Any, ...]]] = []  # messages waiting for a cut proxy
        self._deliver = self._deliver_coord  # one object: the clock batches its entries by identity
        self.clock.batch(self._deliver, self._deliver_many)
        self.chaos = SimChaos(self, scenario)
        self.standby = StandbyPool.for_run(cfg, scenario is not None)
        self.store = SimStore(self)
        self.heartbeats = Heartbeats(self)
        self.learning = Learning(self)
        self.rounds = Rounds(self)
        self.coord = SimCoordinator(self)
        self.sites = {s: SimSite(self, s, i) for i, s in enumerate(cfg.cluster.sites)}
        # Modeled WAN byte counters (sim/wan_bytes.py): only where logs are written (at scale, nothing reads them).
        self.wan = WanTally(cfg.wan.chunk_bytes, model, self.pid_of) if self.write_logs else None

    def pid_of(self, process: str) -> int | None:
        """The pid of the running incarnation of a process, or None (not running)."""
        site = self.sites.get(process)
        if site is not None:
            return site.pid if site.alive else None
        if process == "coord" and self.coord.down:
            return None
        return PROCESS_PIDS.get(process)

    def log_for(self, process: str) -> Any:
        if process not in self.logs:
            if self.run_dir is None:
                self.logs[process] = NullLog()
            else:
                self.logs[process] = SimLog(self.run_dir / "logs" / f"{process}.jsonl", self.cfg.run_id, process,
                                            self.clock, PROCESS_PIDS.get(process, 0))
        return self.logs[process]

    # ------------------------------------------------------------------ the links
    def latency_s(self, site: str, service: str, nbytes: int = 0) -> float:
        return self.links.one_way_s(site, service, nbytes)

    def to_coord(self, src: str, inc: int, epoch: int, kind: str, body: dict[str, Any]) -> None:
        if self.wan is not None:  # heartbeats are sent unreliably (reliable=False)
            self.wan.control(src, "coord", reliable=kind != "heartbeat")
        if self.coord.down or (self.links.cuts and self.links.is_cut(src, "coord")):
            return self.hold((src, "coord"), self._deliver, (src, inc, epoch, kind, body))
        self.clock.at_group(self.clock.now_ns + self.links.one_way_ns(src, "coord"), self._deliver, src, inc, epoch,
                            kind, body)

    def hold(self, proxy: tuple[str, str], fn: Any, args: tuple[Any, ...]) -> None:
        """A message that would cross a cut proxy waits in its sender's queue (the DEALER keeps it;
        the WAN endpoint resends what was not acknowledged) until the proxy passes data again."""
        self.held.append((proxy, fn, args))

    def release(self) -> None:
        """After a heal: every held message whose proxy passes data again is delivered, in the order
        it was sent, once the connection is back (`reconnect_s`) and across the link."""
        keep = []
        for proxy, fn, args in self.held:
            if self.links.is_cut(*proxy) or (proxy[1] == "coord" and self.coord.down):
                keep.append((proxy, fn, args))
                continue
            self.clock.after(self.model.reconnect_s + self.links.one_way_s(*proxy), fn, *args)
        self.held = keep

    def _deliver_coord(self, src: str, inc: int, epoch: int, kind: str, body: dict[str, Any]) -> None:
        self._deliver_many([(src, inc, epoch, kind, body)])

    def _deliver_many(self, msgs: list[tuple[Any, ...]]) -> None:
        """Messages reaching the coordinator at one instant, in order (a dead sender's are lost)."""
        if self.coord.down:  # in flight when it died: the sender resends it to the next incarnation
            for m in msgs:
                self.hold((m[0], "coord"), self._deliver, m)
            return
        sites = self.sites
        got = [m for m in msgs if (site := sites[m[0]]).inc == m[1] and (site.alive or m[3] == "site_done")]
        if got:
            self.coord.receive_all(got)

    def to_site(self, dst: str, kind: str, body: dict[str, Any], epoch: int) -> None:
        if self.wan is not None:
            self.wan.control("coord", dst)
        if self.links.cuts and self.links.is_cut(dst, "coord"):  # the reply stream of the site's own proxy
            return self.hold((dst, "coord"), self.sites[dst].on_control, (kind, body, epoch))
        prof = self.cfg.link_spec(f"{dst}_to_coord").down  # the reply direction of the site's link
        add_s = self.links.one_way_s("coord", dst) - link_one_way_s(self.cfg, "coord", dst)  # a degradation's
        self.clock.after(prof.latency_ms / 1000.0 + add_s, self.sites[dst].on_control, kind, body, epoch)

    def send_state(self, donor: str, joiner: str, epoch: int, state: tuple[str, int, int]) -> None:
        if self.wan is not None:
            self.wan.payload(donor, joiner, "state_transfer", state[2])
        delay = self.model.state_transfer_fixed_s + self.links.one_way_s(donor, joiner, state[2])
        if self.links.cuts and self.links.is_cut(donor, joiner):
            return self.hold((donor, joiner), self._state_after, (delay, joiner, epoch, state, self.sites[donor].gen))
        self.clock.after(delay, self._state_arrives, joiner, epoch, state, self.sites[donor].gen)

    def _state_after(self, delay: float, *args: Any) -> None:
        self.clock.after(delay, self._state_arrives, *args)

    def _state_arrives(self, joiner: str, epoch: int, state: tuple[str, int, int], donor_gen: int) -> None:
        j = self.sites[joiner]
        if j.alive and j.epoch == epoch and j.waiting_state is not None:
            j.receive_state(*state)
        else:
            self.transfers[(epoch, joiner)] = state

    def effective(self, setting: ConsistencySetting) -> RunConfig:
        """ground.setting.effective_config, once per setting (two dataclass copies per site-round otherwise)."""
        got = self._effective.get(setting)
        if got is None:
            got = self._effective[setting] = effective_config(self.cfg, setting)
        return got

    def member_index(self, members: tuple[str, ...]) -> dict[str, int]:
        """Each member's index in a plan's member order (a tuple's .index is O(N) per site)."""
        got = self._index.get(id(members))
        if got is None or got[0] is not members:
            if len(self._index) > 64:
                self._index.clear()
            got = self._index[id(members)] = (members, {m: i for i, m in enumerate(members)})
        return got[1]

    def parse_plan(self, body: dict[str, Any], msg_epoch: int) -> EpochPlan:
        """EpochPlan.from_body, as every site parses it; parsed once per sent body (the core sends the
        same body object to every member, and parsing checks every member's name: N x N at scale)."""
        key = (id(body), msg_epoch)
        got = self._plans.get(key)
        if got is None or got[0] is not body:
            got = self._plans[key] = (body, EpochPlan.from_body(body, msg_epoch, self.site_set))
        return got[1]

    # ------------------------------------------------------------------ shared bookkeeping
    def prefix_sha(self, cursor: int) -> str:
        """samples_sha256 of sample ids 0..cursor-1 (the sites' retained prefix)."""
        if not self.write_logs:
            return ""
        got = self._sha.get(cursor)
        if got is None:
            got = self._sha[cursor] = hashlib.sha256(np.arange(cursor, dtype="<i8").tobytes()).hexdigest()
        return got

    def apply_round(self, phash: str, rnd: int, cs: int, ce: int) -> str:
        """The weights' hash after round rnd (sim/site.chain); every member of a round applies the
        same one to the same hash, so the last is kept (one sha256 per round, not per member)."""
        key = (phash, rnd, cs, ce)
        if self._applied[0] != key:
            self._applied = (key, chain(phash, rnd, cs, ce))
        return self._applied[1]


def write_manifest(run_dir: Path, cfg: RunConfig, scenario: Scenario | None, model: SimModel) -> None:
    logs = run_dir / "logs"
    if logs.is_dir() and any(logs.iterdir()):  # the event logs are appended to: two runs would be one history
        raise FileExistsError(f"{logs} already holds a run's logs: a simulation writes a fresh run directory")
    logs.mkdir(parents=True, exist_ok=True)
    (run_dir / "coordinator").mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.json")
    if scenario is not None:
        (run_dir / "scenario.json").write_text(json.dumps(scenario.to_dict(), indent=2))
    (run_dir / MANIFEST).write_text(json.dumps({
        "simulated": True, "evidence": "modeled", "simulator": "sim (discrete-event, virtual clock)",
        "sample_ids": "canonical positions (the simulator has no corpus)",
        "model": model.to_json(), "learning": LearningCurve.from_json(model.learning).to_json(),
        "not_modeled": ["Toxiproxy's own byte counters (byte reconciliation is unknown); the WAN endpoints' "
                        "counters are modeled (sim/wan_bytes.py): no resends, no interrupted collective parts",
                        "link_degrade with toxicity below 1 (refused); jitter and a slicer's size variation "
                        "at their means"],
    }, indent=2))


def simulate(cfg: RunConfig, scenario: Scenario | None, model: SimModel | None = None, out: Path | None = None,
             max_sim_s: float = 36_000.0, wall_stop: Callable[[], bool] | None = None) -> SimResult:
    """Run one simulation until the coordinator's shutdown reaches every site, `max_sim_s` virtual
    seconds, or `wall_stop()` (checked every 4,096 clock entries run: a wall-clock budget for benchmarks)."""
    model = model or SimModel()
    if scenario is not None:
        check_supported(scenario)
    if out is not None:
        write_manifest(out, cfg, scenario, model)
    w = World(cfg, scenario, model, out)
    w.store.start()
    w.coord.start()
    for s in w.sites.values():
        s.start(model.start_s)
    polls = itertools.count(1)

    def stop() -> bool:
        # Counted here, not from events_run: a batch of deliveries adds its size at once and could
        # step over every multiple of 4,096, so the budget would never be looked at.
        if wall_stop is not None and next(polls) % 4096 == 0 and wall_stop():
            return True
        return w.coord.state.shutdown_sent and not any(s.alive for s in w.sites.values())

    with few_collections():
        w.clock.run(ns(max_sim_s), stop=stop)
    w.chaos.finish()
    w.coord.close()
    for s in w.sites.values():
        if s.alive:
            s.final_counters()
            s.log.emit("site_stopped", reason="end of simulation", rc=0)
    if w.wan is not None:
        for proc in ("coord", "store"):
            w.wan.emit(w.log_for(proc), proc, w.pid_of(proc), final=True)
    for lg in w.logs.values():
        lg.close()
    st = w.coord.state
    return SimResult(out, w.clock.now_ns / 1e9, st.shutdown_sent, len(st.commits), st.membership.epoch,
                     w.coord.core_steps, w.clock.events_run, st.committed_cursor * cfg.model.seq_len,
                     w.coord.core_ns / 1e9, {k: (c, ns_ / 1e9) for k, (c, ns_) in w.coord.core_by_kind.items()},
                     w.chaos.never_fired())
