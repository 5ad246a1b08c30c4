"""Adopting a membership epoch's plan at a site: fence, setting, and the state the plan names.

The state comes from the site's own round-start snapshot (a rollback), from a donor by peer state
transfer, or from the store's durable checkpoint named by hash; a donor also sends its state to
the epoch's joiners. Every restore is one `restore` span in the site's log. What to do with a plan is decided in
`site_core.adoption` (the simulator takes the same decisions); this module carries it out.

`EpochAdoption` holds methods only: `site_agent.agent.Site` owns the state they use.
"""

from __future__ import annotations

import os
from typing import Any

from ground.fields import Rejected
from ground.plans import EpochPlan
from ground.topology import COORD
from ground.schedule import ids_at, round_span
from ground.setting import effective_config
from site_agent.carry import Resume, reusable_steps
from site_agent.consistency import plan_setting
from site_agent.state import load_blobs, restore_snapshot, retained_of, samples_sha256, with_lineage
from site_agent.state_transfer import StateTransferError, pack_state, receive_state, send_state, unpack_state
from site_agent.unwind import Interrupted
from site_core.adoption import Adopt, Rollback, decide_adoption, decide_rollback, may_carry
from wan.frames import TrafficClass

CONTROL = TrafficClass.CONTROL.value
STATE_HANDOFF_WAIT_S = 2.0  # at most this long for a sent state to leave the outbox before the counters are logged


class EpochAdoption:
    """Epoch adoption and state restore for Site (state: plan, epoch, snapshots, retained, trainer, ...)."""

    def adopt(self, plan: EpochPlan) -> bool:
        """Take a new epoch's plan; restore the state it names. True if we should train now."""
        log = self.log
        self.ckpt.wait()  # the checkpoint in flight belongs to the epoch we leave; it ends first
        self.plan = plan
        self.epoch = plan.epoch
        self.status["epoch"] = self.epoch
        self.node.set_fence(self.epoch)
        self.allreduce.reset(self.epoch)
        setting, start_step, _prev = plan_setting(self.cfg, plan)
        self.allreduce.set_compression(setting.compression)
        self.step_at_end[plan.start_round - 1] = start_step
        log.set_context(epoch=self.epoch)
        members = list(plan.members)
        log.emit("membership", members=members, paused=plan.paused, start_round=plan.start_round,
                 start_cursor=plan.start_cursor, restore=plan.restore.value, donor=plan.donor, joiners=list(plan.joiners),
                 setting=setting.to_json(), start_step=start_step)
        # Steps carried into an earlier epoch belong to the trainer state that took them: an epoch
        # that loads another state (the store's, a donor's) or rolls back must not resume after them
        # (soak seed 1007: a resume left from an abandoned epoch skipped steps a donor's state never
        # took, and they were attested under an epoch that never logged them). Only carry_over sets it.
        self.resume = None
        d = decide_adoption(self.me, plan)  # site_core.adoption: the decision; here, carrying it out
        self.snapshots = {k: v for k, v in self.snapshots.items() if k <= d.keep_snapshots_through}
        if d.action == Adopt.REJOIN:
            log.emit("not_a_member", epoch=self.epoch)
            self.node.send(COORD, "join", CONTROL, {"pid": os.getpid(), "rejoin": True})
            return False
        start = plan.start_round
        if d.action == Adopt.PAUSE:
            log.emit("paused", reason=d.reason)
            if d.checkpoint_first:
                # Preemption with notice under `restart`: make the committed state durable first.
                with log.span("restore", kind="rollback_for_checkpoint", start_round=start) as sp:
                    self.rollback_to(start, sp)
                self.next_round = start
                self.checkpoint(start - 1, plan.start_cursor)
            return False
        self.leader = d.leader
        with log.span("restore", kind=plan.restore.value, start_round=start) as sp:
            if d.action == Adopt.STORE:
                self.progress = None  # the trainer's round in flight is gone with its state
                self.restore_from_store(plan, sp)
            elif d.action == Adopt.RECEIVE:
                self.progress = None
                self.receive_from_donor(plan, sp)
            else:
                if not (d.try_carry and self.carry_over(plan, sp)):
                    self.rollback_to(start, sp)
                if d.send_to:
                    self.send_to_joiners(plan, sp)
            sp.update(retained_samples=int(self.retained.size), samples_sha256=samples_sha256(self.retained))
        # Carried in: the trainer holds a mid-round state, so a later rollback must use the snapshot.
        self.next_round = None if self.resume is not None else start
        if self.pool is not None:
            self.pool.load_state(pack_state(self.trainer.state_tensors()))
        if d.checkpoint_first:
            # The oracle drains a site just before its fault: make the committed state durable first.
            self.checkpoint(start - 1, plan.start_cursor)
        return True

    def carry_over(self, plan: EpochPlan, sp: dict[str, Any]) -> bool:
        """Keep the inner steps already taken in the round this carried epoch takes over
        (site_agent.carry): True if some were kept (then `self.resume` says where to go on)."""
        prog, self.resume = self.progress, None
        setting, _step, _prev = plan_setting(self.cfg, plan)
        cfg = effective_config(self.cfg, setting)
        held = (prog.round, prog.cursor, prog.mode, prog.steps_h) if prog is not None else None
        if self.pool is not None or not may_carry(plan, self.next_round, held, cfg.train.mode,
                                                  cfg.train.inner_steps_h)[0]:
            return False
        assert prog is not None
        n = len(plan.members)
        cs, ce = round_span(cfg, n, plan.start_round, plan.start_cursor, plan.start_round, self.target)
        wanted = [(tuple(ids_at(self.order, r)), f) for r, f in
                  self.step_layout(cfg, plan.start_round, n, plan.members.index(self.me), cs, ce)]
        k, from_copy = reusable_steps(prog, wanted)
        if k == 0:
            return False
        if from_copy:
            assert prog.mid is not None
            prog.mid.restore(self.trainer)
        dropped = len(prog.done) - k
        for h in range(k):
            ids = list(prog.done[h][0])
            self.log.emit("work_carried", round=prog.round, inner_step=h, from_epoch=prog.epochs[h], samples=ids,
                          tokens=len(ids) * cfg.model.seq_len)
        del prog.done[k:], prog.losses[k:], prog.epochs[k:]
        prog.mid = None
        self.resume = Resume(prog.round, k, [i for ids, _f in prog.done for i in ids],
                             [x for x in prog.losses if x is not None])
        sp.update(rolled_back=False, carried_steps=k, from_mid_copy=from_copy, dropped_steps=dropped)
        return True

    def rollback_to(self, start: int, sp: dict[str, Any]) -> None:
        """Make the trainer hold the state at the start of round `start` (our own snapshot)."""
        how, why = decide_rollback(self.next_round, start, self.snapshots, self.epoch)
        if how == Rollback.HELD:
            sp["rolled_back"] = False
            return
        if how == Rollback.MISSING:
            raise RuntimeError(why)
        snap = self.snapshots[start]
        restore_snapshot(self.trainer, snap)
        self.retained = snap.retained.copy()
        sp.update(rolled_back=True, from_round=self.next_round, params_hash=snap.params_hash)

    def restore_from_store(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        want = plan.manifest_hash
        if want is None:  # nothing durable yet: everyone restarts from the initial weights
            restore_snapshot(self.trainer, self.initial)
            self.retained = self.initial.retained.copy()
            sp.update(source="initial weights", params_hash=self.initial.params_hash)
            return
        if self.store is None:
            raise RuntimeError("restore from the store, but this site has no route to it")
        # By hash, not "the frontier": a background upload may have made a newer checkpoint the
        # frontier since the coordinator planned this restore; the plan's checkpoint is still there.
        manifest = self.store.checkpoint(want, timeout_s=60.0)
        blobs = self.store.load(manifest, timeout_s=120.0)
        retained = retained_of(blobs, f"checkpoint {want}", manifest.get("samples_sha256"))
        load_blobs(self.trainer, blobs)
        got = self.trainer.params_hash()
        if got != manifest["params_hash"]:
            raise RuntimeError(f"checkpoint {want}: loaded parameters do not match the manifest's hash")
        _check_committed(got, plan, f"checkpoint {want}", sp)
        self.retained = retained
        sp.update(source="store", manifest_hash=want, params_hash=manifest["params_hash"], round=manifest["round"])

    def receive_from_donor(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        donor = plan.donor
        assert donor is not None  # parse_plan: a donor restore names one
        # Only an epoch that takes effect by this plan's first round makes the state void. One from a
        # later round (the oracle draining a site at the next boundary) needs this state and the
        # rounds up to it: the members wait for us in this plan's first round (churn under oracle:
        # b dropped its transfer for round 8 when a drain from round 9 came, failed its restore, and
        # was declared failed while the others waited for it).
        try:
            data, meta = receive_state(self.state_q, donor, self.epoch, timeout_s=120.0,
                                       interrupted=lambda: self.newer_plan_waiting(plan.start_round),
                                       max_total=self.max_state_bytes(),
                                       reject=self._reject_state_chunk)
        except StateTransferError as e:
            sp["error_detail"] = str(e)
            raise Interrupted(f"state transfer from {donor} failed: {e}") from e
        blobs = unpack_state(data)
        retained = retained_of(blobs, f"state from {donor}", meta["samples_sha256"])
        load_blobs(self.trainer, blobs)
        got = self.trainer.params_hash()
        if got != meta["params_hash"]:
            raise RuntimeError(f"state from {donor}: parameters hash {got} != announced {meta['params_hash']}")
        _check_committed(got, plan, f"state from {donor}", sp)
        self.retained = retained
        self.log.emit("state_received", donor=donor, bytes=len(data), params_hash=got, round=meta["round"],
                      samples_sha256=meta["samples_sha256"])
        sp.update(source="donor", donor=donor, bytes=len(data), params_hash=got)

    def max_state_bytes(self) -> int:
        """The most bytes a donor's packed state may announce: generously above our own state's size."""
        own = sum(t.numel() * t.element_size() for g in self.trainer.state_tensors().values() for t in g.values())
        return 4 * own + 8 * self.target + (1 << 20)

    def _reject_state_chunk(self, msg: Any, e: Rejected) -> None:
        self.log.emit("message_rejected", kind=msg.kind, src=msg.src, msg_epoch=msg.epoch, reason=e.reason,
                      detail=e.detail)

    def send_to_joiners(self, plan: EpochPlan, sp: dict[str, Any]) -> None:
        data = pack_state(with_lineage(self.trainer.state_tensors(), self.retained))
        meta = {"round": plan.start_round, "params_hash": self.trainer.params_hash(),
                "samples_sha256": samples_sha256(self.retained)}
        for j in plan.joiners:
            n = send_state(self.node, j, data, meta, self.cfg.wan.chunk_bytes, self.epoch)
            self.log.emit("state_sent", joiner=j, bytes=n, params_hash=meta["params_hash"], round=meta["round"],
                          samples_sha256=meta["samples_sha256"])
        if plan.joiners:
            # The byte counters once the state has left this process (handed to ZeroMQ, where it is
            # counted): a donor killed before its next round's snapshot still accounts for the state it
            # sent, delivered or not; the receivers' counters cannot (issue 54: 7 MB sent into a
            # blackholed link by a donor preempted right after were counted by no one).
            for j in plan.joiners:
                self.node.wait_handed(j, STATE_HANDOFF_WAIT_S)
            self.log.emit("wan_counters", counters=self.node.counters.snapshot())
        sp.update(sent_to=list(plan.joiners), bytes=len(data))


def _check_committed(got: str, plan: EpochPlan, what: str, sp: dict[str, Any]) -> None:
    """Refuse restored parameters whose hash is not the one the commit record names for this plan
    (`plan.params_hash`; None: the record names none); record the check in the restore span."""
    if plan.params_hash is None:
        return
    if got != plan.params_hash:
        raise RuntimeError(f"{what}: restored parameters {got} are not the committed round's {plan.params_hash} "
                           f"(the commit record, epoch {plan.epoch}): refused")
    sp["committed_params_hash"] = plan.params_hash
