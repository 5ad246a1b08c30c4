"""One simulated site process: the emulator's site protocol (site_agent/agent.py) on the virtual clock.

The same plan handling (ground.plans.EpochPlan parses the coordinator's body; site_core.epochs
picks which plan to adopt and when a newer one interrupts; site_core.adoption decides what adopting
it means: rejoin, pause, the store, a donor, or the own state carried over or rolled back), the
same round schedule (ground.schedule), the same messages to the coordinator. What takes time is modeled
(sim/model.py); the parameters' hash is a hash chain over the rounds applied, so members that
applied the same rounds hold the same hash and the coordinator's commit check is real.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from ground import gates
from ground.plans import EpochPlan
from ground.setting import base_setting
from sim.engine import ns
from sim.model import checkpoint_blob_bytes, state_bytes
from sim.services import UPLOAD_BLOCKED_NS
from site_core.adoption import Adopt, Rollback, decide_adoption, decide_rollback
from site_core.epochs import interrupts, next_plan, not_for_this_process

if TYPE_CHECKING:
    from sim.progress import Progress, Step
    from sim.world import World

INITIAL = "initial weights"


def chain(prev: str, *parts: Any) -> str:
    return hashlib.sha256(":".join([prev, *map(str, parts)]).encode()).hexdigest()


class SimSite:
    def __init__(self, w: World, name: str, index: int) -> None:
        self.w, self.name, self.index = w, name, index
        self.log = w.log_for(name)
        self.inc, self.pid, self.alive, self.gen = 0, 0, False, 0
        self.initial_hash = chain(w.cfg.run_id, "init", w.cfg.train.seed)
        self._fresh()

    def _fresh(self) -> None:
        self.epoch, self.plan, self.pending = 0, None, []
        self.phash, self.retained = self.initial_hash, 0  # retained: sample ids 0..retained-1 (a prefix)
        self.next_round: int | None = 0
        self.snapshots: dict[int, tuple[str, int]] = {}
        self.inflight: int | None = None
        self.busy = False  # training or restoring: a new plan waits for a boundary
        self.leader, self.done_epoch, self.round = False, -1, -1
        self.eval_until_ns = 0  # the evaluation in flight (the evaluator thread) ends then
        self.upload_until_ns = 0  # the checkpoint upload in flight ends then
        self.upload_waiters: list[tuple[Any, tuple[Any, ...]]] = []  # what waits for a blocked upload
        self.waiting_state: tuple[int, int] | None = None  # (gen, start ns) while a donor's state is due
        self.setting = base_setting(self.w.cfg)
        self.start_step = 0
        # The compute in flight: (round, cursor start, end, H, start ns, s per step, first step, layout).
        self.cur: tuple[int, int, int, int, int, float, int, list[Step]] | None = None
        self.progress: Progress | None = None  # the inner steps taken in the round in flight
        self.resume: tuple[int, int] | None = None  # carried in: (round, steps kept)
        self.mine: list[int] | tuple[()] = []  # the round's sample ids (() when not made: sim/rounds.computed)
        self.n_mine = 0  # how many samples the site took in the round
        self.compute_s = 0.0

    # ------------------------------------------------------------------ process life
    def start(self, delay_s: float) -> None:
        self.gen += 1
        self.inc += 1
        self.pid = 1000 * (self.index + 1) + self.inc
        self._fresh()
        self.w.clock.after(delay_s, self._started, self.gen)

    def _started(self, gen: int) -> None:
        if gen != self.gen:
            return
        self.alive = True
        self.log.pid = self.pid if hasattr(self.log, "pid") else 0
        self.log.set_context(epoch=0, step=0)
        m = self.w.cfg.model
        self.log.emit("site_started", device="sim", threads=1, dataset_id="simulated", n_params=self.w.n_params,
                      flops_per_token=self.w.flops_per_token, params_hash=self.initial_hash, torch=None,
                      workers_per_site=1, seq_len=m.seq_len)
        self.send("join", {"pid": self.pid})
        self.w.heartbeats.start(self)

    def kill(self, teardown_s: float = 0.0, close_s: float | None = None) -> None:
        """SIGKILL: everything in flight is lost; the coordinator sees the connection close `close_s`
        later (None: once the process has exited, `teardown_s` later; a clean exit's own kill: at once)."""
        self.w.rounds.abandon(self, killed=True)
        self.alive, self.busy = False, False
        self.gen += 1
        after_s = teardown_s if close_s is None else close_s
        if after_s > 0:
            self.w.clock.after(after_s, self.w.coord.connection_lost, self.name)
        else:
            self.w.coord.connection_lost(self.name)

    def terminate(self) -> None:
        """SIGTERM (a preemption notice): stop at the next check, tell the coordinator
        (if a member still training), wait for its ack, exit; the connection then closes."""
        if not self.alive:
            return
        self.log.emit("signal", signal="SIGTERM")
        # Between inner steps the agent notices the signal at its next check (preempt_exit_s); waiting
        # at a fault gate, within the wait's poll (ground/gates.py).
        notice_s = self.w.model.preempt_exit_s
        if self.w.rounds.gates.waiting(self):
            notice_s = gates.POLL_S
            self.w.rounds.gates.leave(self, go_on=False)
        self.w.rounds.abandon(self)
        self.gen += 1
        self.busy, self.inflight, self.waiting_state = True, None, None  # no new plan is acted on now
        self.w.clock.after(notice_s, self._announce, self.inc)

    def _announce(self, inc: int) -> None:
        if inc != self.inc or not self.alive:
            return
        rtt = 2 * self.w.latency_s(self.name, "coord")
        if self.plan is not None and self.name in self.plan.members and self.done_epoch < 0:
            self.send("preempt_notice", {"grace_s": None, "round": self.round})
            self.log.emit("preemption_announced", round=self.round)
        self.w.clock.after(rtt, self._exit, inc)

    def final_counters(self) -> None:
        """A clean exit logs the incarnation's final WAN counters (a killed one cannot)."""
        if self.w.wan is not None and self.alive:
            self.w.wan.emit(self.log, self.name, self.pid, final=True)

    def _exit(self, inc: int) -> None:
        if inc == self.inc and self.alive:
            self.final_counters()
            self.log.emit("site_stopped", reason="signal", rc=0)
            self.kill()

    # ------------------------------------------------------------------ messages
    def send(self, kind: str, body: dict[str, Any]) -> None:
        self.w.to_coord(self.name, self.inc, self.epoch, kind, body)

    def on_control(self, kind: str, body: Any, msg_epoch: int) -> None:
        if not self.alive:
            return
        if kind == "shutdown":
            self.final_counters()
            self.alive, self.gen = False, self.gen + 1
            done = self.done_epoch >= 0
            self.log.emit("site_stopped", reason="completed" if done else f"shutdown: {body.get('reason')}",
                          rc=0)
            return
        plan = self.w.parse_plan(body, msg_epoch)
        other = not_for_this_process(plan, self.name, self.inc)  # site_core.epochs: a plan for another incarnation
        if other is not None:
            self.log.emit("membership_skipped", skipped_epoch=plan.epoch, start_round=plan.start_round, reason=other)
            return
        self.pending.append(plan)
        if not self.busy:
            self.next_control()
        elif self.waiting_state is not None and self.plan is not None and interrupts(self.pending, self.epoch,
                                                                                    self.plan.start_round):
            # Only an epoch from this plan's first round on voids the state.
            self.log.emit("restore_abandoned", epoch=self.epoch, reason="a newer epoch arrived while we restored")
            self._idle()
        elif self.inflight is not None and interrupts(self.pending, self.epoch, self.inflight):
            if self.w.rounds.gates.waiting(self):
                self.w.rounds.gates.leave(self)
            else:
                self._interrupt()

    def next_control(self) -> None:
        if self.upload_until_ns > self.w.clock.now_ns:
            # The checkpoint in flight belongs to the epoch we leave; it ends first.
            self.after_upload(self._control_later, self.inc)
            return
        plan, waiting, skipped = next_plan(self.pending, self.epoch, self.name, self.plan)
        self.pending = list(waiting)
        for p, why in skipped:
            self.log.emit("membership_skipped", skipped_epoch=p.epoch, start_round=p.start_round, reason=why)
        if plan is not None:
            self.adopt(plan)

    def after_upload(self, fn: Any, *args: Any) -> None:
        """Run fn(*args) once the checkpoint upload in flight has ended (one blocked by a cut link to
        the store ends only after the heal: sim/services.py runs what waited then)."""
        if self.upload_until_ns >= UPLOAD_BLOCKED_NS:
            self.upload_waiters.append((fn, args))
        else:
            self.w.clock.at(max(self.w.clock.now_ns, self.upload_until_ns), fn, *args)

    def _control_later(self, inc: int) -> None:
        if inc == self.inc and self.alive and not self.busy:
            self.next_control()

    def _idle(self) -> None:
        self.gen += 1
        self.busy, self.inflight, self.waiting_state = False, None, None
        self.next_control()

    # ------------------------------------------------------------------ epochs
    def adopt(self, plan: EpochPlan) -> None:
        log, w = self.log, self.w
        self.plan, self.epoch = plan, plan.epoch
        self.setting = plan.setting if plan.setting is not None else base_setting(w.cfg)
        self.start_step = int(plan.start_step) if plan.start_step is not None else \
            plan.start_round * self.setting.steps_per_round
        log.set_context(epoch=self.epoch)
        members = list(plan.members)
        log.emit("membership", members=members, paused=plan.paused, start_round=plan.start_round,
                 start_cursor=plan.start_cursor, restore=plan.restore.value, donor=plan.donor,
                 joiners=list(plan.joiners), setting=self.setting.to_json(), start_step=self.start_step)
        d = decide_adoption(self.name, plan)  # site_core.adoption: the agent's decision, carried out here
        self.snapshots = {k: v for k, v in self.snapshots.items() if k <= d.keep_snapshots_through}
        if d.action == Adopt.REJOIN:
            log.emit("not_a_member", epoch=self.epoch)
            self.send("join", {"pid": self.pid, "rejoin": True})
            return
        start = plan.start_round
        if d.action == Adopt.PAUSE:
            log.emit("paused", reason=d.reason)
            if d.checkpoint_first and self._rollback(start, {}):
                self.checkpoint(start - 1, plan.start_cursor)
            return
        self.leader = d.leader
        sp: dict[str, Any] = {}
        t0 = w.clock.now_ns
        if d.action == Adopt.STORE:
            if not self._from_store(plan, sp, t0):
                return
            # The read is the store's work: a stopped store (store_outage) holds it until it continues.
            w.clock.at(w.clock.now_ns + ns(sp.pop("_s", 0.0)), w.store.read_done, self, self.gen, plan, sp, t0)
            self.busy = True
            return
        if d.action == Adopt.RECEIVE:
            self.busy, self.waiting_state = True, (self.gen, t0)
            got = w.transfers.pop((self.epoch, self.name), None)
            if got is not None:
                self.receive_state(*got)
            return
        if not (d.try_carry and self.w.rounds.carry_over(self, plan, sp)) and not self._rollback(start, sp):
            log.span_at("restore", t0, t0, kind=plan.restore.value, start_round=start, **sp)
            log.emit("restore_failed", epoch=self.epoch, error=f"RuntimeError: {sp.get('error_detail')}")
            self.plan = None
            self.send("join", {"pid": self.pid, "rejoin": True})
            return
        if d.send_to:
            self.send_state(plan, sp)
        self._restored(plan, sp, t0, t0)

    def _rollback(self, start: int, sp: dict[str, Any]) -> bool:
        how, why = decide_rollback(self.next_round, start, self.snapshots, self.epoch)
        if how == Rollback.HELD:
            sp["rolled_back"] = False
            return True
        if how == Rollback.MISSING:
            sp["error_detail"] = why
            return False
        snap = self.snapshots[start]
        sp.update(rolled_back=True, from_round=self.next_round, params_hash=snap[0])
        self.phash, self.retained = snap
        self.next_round = start
        return True

    def _from_store(self, plan: EpochPlan, sp: dict[str, Any], t0: int) -> bool:
        if plan.manifest_hash is None:
            self.phash, self.retained = self.initial_hash, 0
            sp.update(source=INITIAL, params_hash=self.initial_hash)
            return True
        man = self.w.store.manifests.get(plan.manifest_hash)
        if man is None:
            sp["error_detail"] = f"checkpoint {plan.manifest_hash} is not in the store"
            self.log.emit("restore_failed", epoch=self.epoch, error=sp["error_detail"])
            self.send("join", {"pid": self.pid, "rejoin": True})
            return False
        read_s = self.w.model.checkpoint_fixed_s + man["bytes"] / self.w.model.checkpoint_read_bytes_per_s
        self.log.span_at("checkpoint_load", t0, t0 + ns(read_s), ckpt_id=man["ckpt_id"], round=man["round"],
                         manifest_hash=plan.manifest_hash, bytes=man["bytes"])
        if self.w.wan is not None:
            self.w.wan.checkpoint_read(self.name, checkpoint_blob_bytes(self.w.cfg.model, man["cursor"]))
        self.phash, self.retained = man["params_hash"], man["cursor"]
        sp.update(source="store", manifest_hash=plan.manifest_hash, params_hash=self.phash, round=man["round"],
                  _s=read_s)
        return True

    def send_state(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        nbytes = state_bytes(self.w.cfg.model, self.retained)
        sha = self.w.prefix_sha(self.retained)
        for j in plan.joiners:
            self.log.emit("state_sent", joiner=j, bytes=nbytes, params_hash=self.phash, round=plan.start_round,
                          samples_sha256=sha)
            self.w.send_state(self.name, j, self.epoch, (self.phash, self.retained, nbytes))
        sp.update(sent_to=list(plan.joiners), bytes=nbytes)

    def receive_state(self, phash: str, retained: int, nbytes: int) -> None:
        if self.waiting_state is None or not self.alive:
            return
        t0 = self.waiting_state[1]
        self.waiting_state = None
        self.phash, self.retained = phash, retained
        assert self.plan is not None
        self.log.emit("state_received", donor=self.plan.donor, bytes=nbytes, params_hash=phash,
                      round=self.plan.start_round, samples_sha256=self.w.prefix_sha(retained))
        self._restored(self.plan, {"source": "donor", "donor": self.plan.donor, "bytes": nbytes, "params_hash": phash},
                       t0, self.w.clock.now_ns)

    def _restored(self, plan: EpochPlan, sp: dict[str, Any], t0: int, t1: int) -> None:
        self.busy = True
        self.w.clock.at(t1, self._after_restore, self.gen, plan, sp, t0)

    def _after_restore(self, gen: int, plan: EpochPlan, sp: dict[str, Any], t0: int) -> None:
        if gen != self.gen:
            return
        start = plan.start_round
        self.log.span_at("restore", t0, self.w.clock.now_ns, kind=plan.restore.value, start_round=start,
                         retained_samples=self.retained, samples_sha256=self.w.prefix_sha(self.retained), **sp)
        self.next_round = start
        if plan.checkpoint_first and self.leader and start > 0:
            self.checkpoint(start - 1, plan.start_cursor)
        if self.leader and start == 0 and not self.w.evaluated_initial:
            self.w.evaluated_initial = True
            self.w.learning.evaluate(self, -1, 0)
        self.w.rounds.start(self, start)

    # ------------------------------------------------------------------ rounds
    def _interrupt(self) -> None:
        self.w.rounds.abandon(self)
        self.log.emit("round_abandoned", round=self.round, reason=f"a newer epoch arrived during round {self.round}")
        self._idle()

    def checkpoint(self, rnd: int, cursor: int) -> None:
        self.w.store.write(self, rnd, cursor)
