"""The coordinator's rules, applied to a working copy of its state (see coordinator/core.py).

Membership and failure detection (`coordinator/membership.py`), recovery plans
(`coordinator/recovery.py`), the commit record, the frontier and completion: every handler reads
and changes the working copy and appends what the shell must do to `out`. No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from coordinator import claims, commits, membership
from coordinator.commits import ROUND_WINDOW
from coordinator.membership import member_set
from coordinator.core_types import RECEIVED, Context, Fence, Journal, Messages, Received, Send, Tick
from coordinator.recovery import ClusterView, Frontier, checkpoint_before_waiting, decide_recovery
from coordinator.replay import after_epoch
from coordinator.working import WorkingCopy
from coordinator.settings import due_change, setting_for_epoch
from ground.messages import (BadMessage, Built, CheckpointDurable, Heartbeat, Join, PreemptNotice,
                             RoundDone, SiteDone, Telemetry, parse)
from ground.plans import EpochPlan, Plan, Restore
from ground.records import EpochRecord
from ground.schedule import samples_per_round, tokens_of_samples
from ground.setting import ConsistencySetting

class Rules(WorkingCopy):
    """The handlers and the steps of membership, settings and completion, over the working copy
    (coordinator/working.py). Used only through coordinator/core.py."""

    # ------------------------------------------------------------------ journal
    # ------------------------------------------------------------------ messages
    def handle(self, msg: Received, now_ns: int, report: RoundDone | None = None) -> None:
        """One received message: validated, then applied. Nothing in a message can stop the loop.
        `report`: the message is a round report already known good to dispatch (its header epoch
        announced, its body a typed report: `_round_reports`), given to its handler directly."""
        try:
            if report is None:
                self.on_message(msg, now_ns)
            else:
                commits.on_round_done(self, msg, report, now_ns)
        except BadMessage as e:
            self.reject(msg, f"bad_body: {e}")
        except Exception as e:  # a bug met by one message is logged; the coordinator goes on
            self.reject(msg, f"internal_error: {type(e).__name__}: {str(e)[:500]}")

    def messages(self, batch: Messages, now_ns: int) -> None:
        """Messages of one kind at one instant, in order, each what `handle` does with it as a Received:
        heartbeats and round reports through their common case in one pass (`_heartbeats`,
        `_round_reports`), any other kind one `handle` each."""
        if batch.kind == "heartbeat":
            self._heartbeats(batch.messages, now_ns)
        elif batch.kind == "round_done":
            commits.round_reports(self, batch.messages, now_ns)
        else:
            for m in batch.messages:
                self.handle(RECEIVED(*m), now_ns)

    def _heartbeats(self, messages: tuple[tuple[str, int, int, str, Any], ...], now_ns: int) -> None:
        """The common heartbeat (a site the membership knows, a header epoch announced, a heartbeat of the
        current epoch or of none yet, a body the simulator built) is `_on_heartbeat`'s record write
        (membership.heard, inline), nothing else (no reject, no plan to send); any other goes through
        `handle`, and the loop reads the state again. The sites of an instant share one body: the last
        body found good is known good by its identity."""
        epoch, sites = self.membership.epoch, self._sites_for_write()
        record, get = membership.SITE_RECORD, sites.get
        good: Any = None  # the last body found to be a built heartbeat of this epoch or of none
        for m in messages:
            src, inc, msg_epoch, kind, body = m
            known = get(src)
            if known is not None and 0 <= msg_epoch <= epoch and kind == "heartbeat" and (
                    body is good or (type(body) is Built and type(hb := body.typed) is Heartbeat
                                     and (hb.epoch == epoch or hb.epoch == 0))):
                good = body
                sites[src] = record(known.name, known.state, now_ns, known.incarnation or inc, known.disconnected_ns)
            else:
                self.handle(RECEIVED(*m), now_ns)
                epoch, sites = self.membership.epoch, self._sites_for_write()
                get, good = sites.get, None

    def on_message(self, msg: Received, now_ns: int) -> None:
        """Check the epoch and the body against the kind's typed message, then dispatch (BadMessage if bad)."""
        if msg.epoch < 0 or msg.epoch > self.membership.epoch:
            # Never announced: no site can be in a later epoch than the coordinator (it journals an
            # epoch before anyone hears of it, and recovers it from the journal after a crash).
            self.reject(msg, f"future_epoch: message epoch {msg.epoch} was never announced "
                             f"(current epoch {self.membership.epoch})")
            return
        typed = parse(msg.kind, msg.body)
        HANDLERS[msg.kind](self, msg, typed, now_ns)

    def _on_join(self, msg: Received, j: Join, now_ns: int) -> None:
        if (msg.src, msg.inc) in self.oracle_dropped:
            self.emit("join_deferred", site=msg.src, reason="oracle dropped this incarnation before its fault")
            return
        before = self.membership.sites.get(msg.src)
        if j.rejoin and msg.src in self.membership.members and self._answer_active_rejoin(msg, before):
            return
        if j.rejoin and msg.src in self.membership.members:
            # A member lost its state (a restore failed twice): it leaves and comes back as a joiner.
            self.membership = membership.set_state(self.membership, msg.src, "removed")
        self.membership = membership.on_join(self.membership, msg.src, now_ns, msg.inc)
        self.emit("site_joined", site=msg.src, incarnation=msg.inc, site_pid=j.pid,
                  state=self.membership.sites[msg.src].state.value,
                  previous_state=before.state.value if before else None)
        m = self.membership
        if m.epoch > 0 and msg.src in m.members and m.sites[msg.src].state == membership.SiteState.ACTIVE:
            self.send_plan([msg.src])  # a lost reply: tell it again

    def _answer_active_rejoin(self, msg: Received, before: membership.SiteRecord | None) -> bool:
        """A member asks to be admitted again although it is alive (same incarnation, heartbeating):
        it could not apply a plan (e.g. it skipped an epoch). That is not its death: it gets the
        current plan again. Once per (incarnation, epoch): asking twice in the same epoch means it
        really lost its state, and it is readmitted as a joiner (False)."""
        if before is None or before.incarnation != msg.inc or before.state not in (membership.SiteState.ACTIVE,
                                                                                   membership.SiteState.SUSPECT):
            return False
        key = (msg.src, msg.inc, self.membership.epoch)
        if msg.epoch < self.membership.epoch:
            why = f"it asked in epoch {msg.epoch}, before it had epoch {self.membership.epoch}: sent the current plan"
        elif key not in self.replanned:
            self.replanned.add(key)
            why = (f"an active member (same incarnation) could not apply epoch {self.membership.epoch}: it is alive, "
                   f"not failed; sent the current plan again")
        else:
            return False
        self.emit("rejoin_answered", site=msg.src, incarnation=msg.inc, msg_epoch=msg.epoch,
                  state=before.state.value, reason=why)
        self.send_plan([msg.src])
        return True

    def _on_heartbeat(self, msg: Received, hb: Heartbeat, now_ns: int) -> None:
        if hb.epoch > self.membership.epoch:
            self.reject(msg, f"future_epoch: heartbeat says epoch {hb.epoch}, never announced "
                             f"(current epoch {self.membership.epoch})")
            return
        # A coordinator restarted from its journal does not know the members' incarnations (0) until
        # they speak: learn it from the first heartbeat, or a drain would hold out incarnation 0 and
        # readmit the drained, still-live process. A known incarnation is changed only by a join.
        known = self.membership.sites.get(msg.src)
        if known is None:
            return  # membership.on_heartbeat ignores an unknown site
        learned = msg.inc if not known.incarnation else 0
        # membership.on_heartbeat's record, written into this step's own site map (O(1), not a copy).
        site = membership.heard(known, now_ns, learned)
        self._sites_for_write()[msg.src] = site
        # A member we removed is still alive (it hung, or was partitioned): tell it, so it rejoins.
        # (The cheap conditions first: every term is side-effect free.)
        if hb.epoch not in (0, self.membership.epoch) and site.state == membership.SiteState.FAILED \
                and self.membership.epoch > 0 and msg.src not in member_set(self.membership.members):
            self.send_plan([msg.src])

    def _on_site_done(self, msg: Received, d: SiteDone, _now_ns: int) -> None:
        if msg.epoch == self.membership.epoch and msg.src in member_set(self.membership.members):
            self.membership = membership.on_done(self.membership, msg.src)
            self.emit("site_done", site=msg.src, round=d.round)

    def _on_telemetry(self, msg: Received, t: Telemetry, _now_ns: int) -> None:
        self.emit("site_metrics", site=msg.src, metrics=dict(t.metrics))  # nested: no key can collide

    def _on_preempt_notice(self, msg: Received, p: PreemptNotice, _now_ns: int) -> None:
        first, why = checkpoint_before_waiting(self.policy)
        self.emit("preemption_notice", site=msg.src, grace_s=p.grace_s, checkpoint_first=first, reason=why)
        self.checkpoint_first = first
        self.membership = membership.set_state(self.membership, msg.src, "announced_failure")
        self.emit("site_failed", site=msg.src, reason="announced its preemption")

    def _on_checkpoint_durable(self, msg: Received, c: CheckpointDurable, _now_ns: int) -> None:
        if msg.epoch != self.membership.epoch and msg.epoch not in self.epoch_members:
            self.reject(msg, f"stale epoch {msg.epoch}")
            return
        # Only the epoch's leader checkpoints (site_agent/adoption.py: the plan's first member), and only
        # rounds near the commit record and past the frontier: another member's report, or one far ahead,
        # would let one site choose the state the cluster recovers to (and grow the pending set).
        members = self.membership.members if msg.epoch == self.membership.epoch else self.epoch_members[msg.epoch]
        if not members or msg.src != members[0]:
            self.reject(msg, f"not the leader: only epoch {msg.epoch}'s leader "
                             f"({members[0] if members else 'none'}) reports a durable checkpoint", round=c.round)
            return
        if c.round > self.committed_round + ROUND_WINDOW:
            self.reject(msg, f"round {c.round} is more than {ROUND_WINDOW} rounds past the commit record "
                             f"({self.committed_round})", round=c.round)
            return
        f = self.frontier
        if f is not None and (c.round, c.cursor, c.manifest_hash) == (f.round, f.cursor, f.manifest_hash):
            return  # the frontier's own report again (a resend): nothing changes
        if f is not None and c.round <= f.round:
            self.reject(msg, f"round {c.round} is not past the frontier (round {f.round}): the frontier never "
                             "goes back", round=c.round)
            return
        commit = next((x.commit_id for x in reversed(self.commits) if x.round == c.round and x.cursor_end == c.cursor),
                      None)
        if commit is None:
            # The leader checkpoints a round as soon as its collective is done, before the commit
            # record has it; that round may yet be aborted. Only a committed state may become the
            # frontier the cluster rolls back to (soak seed 1002: a restart rolled everyone back to
            # an uncommitted round 5 and the lineage lost rounds 0-5).
            self.pending_frontiers[(c.round, c.cursor)] = c.manifest_hash
            # Journaled: a restarted coordinator still makes it the frontier when its round commits.
            self.out.append(Journal({"type": "checkpoint_pending", "round": c.round, "cursor": c.cursor,
                                     "manifest_hash": c.manifest_hash}))
            self.emit("frontier_deferred", round=c.round, cursor=c.cursor, manifest_hash=c.manifest_hash,
                      reason="round not in the commit record yet: becomes the frontier when it commits")
            return
        self.set_frontier(Frontier(c.round, c.cursor, c.manifest_hash, commit))

    def send_plan(self, to: list[str]) -> None:
        if self.plan is None:
            return
        # Checkpoint first: a preemption notice under restart (the paused survivors' leader), or the
        # oracle's drain before a fault (the continuing members' leader), for this epoch only.
        first = bool(self.recent.checkpoint_first_epoch == self.membership.epoch
                     and (self.plan.paused or self.plan.drain is not None))
        es = self.settings.of(self.membership.epoch)  # the epoch's setting, its start step, the mode before it
        body = EpochPlan.announce(self.membership.epoch, self.plan, target_samples=self.target, checkpoint_first=first,
                                  frontier_manifest=self.frontier.manifest_hash if self.frontier else None,
                                  setting=es.setting if es else None, start_step=es.start_step if es else None,
                                  prev_mode=es.prev_mode if es else None).to_body()
        for s in to:
            self.out.append(Send(s, "membership", body, self.membership.epoch))

    # ------------------------------------------------------------------ decisions
    def view(self) -> ClusterView:
        # A member back in JOINING asked to rejoin: for the current epoch it is as good as failed.
        # (The state test first: `s in members` scans a tuple; for every site it made view() O(N^2).)
        # The healthy majority (active, done) passed over in one comprehension (a tick's view reads
        # every site); the few failed or joining sites split after, in the site map's order.
        members, fail, join = member_set(self.membership.members), membership.SiteState.FAILED, \
            membership.SiteState.JOINING
        odd = [(s, x) for s, st in self.membership.sites.items() if (x := st.state) is fail or x is join]
        failed = tuple(s for s, x in odd if x is fail or s in members)
        joiners = tuple(sorted(s for s, x in odd if x is not fail and s not in members))
        paused = bool(self.plan and self.plan.paused)
        # The current epoch was scheduled for a boundary the commit record has not reached yet.
        scheduled = ((self.plan.start_round, self.plan.start_cursor)
                     if self.plan is not None and not paused and self.plan.start_round > self.committed_round + 1
                     else None)
        return ClusterView(expected=tuple(self.cfg.cluster.sites), epoch=self.membership.epoch,
                           members=self.membership.members,
                           paused=paused, failed=failed, joiners=joiners,
                           committed_round=self.committed_round, committed_cursor=self.committed_cursor,
                           frontier=self.frontier, target_samples=self.target, drop_before=self.oracle.ahead(),
                           round_samples=0 if paused else samples_per_round(self.settings.effective(),
                                                                            len(self.membership.members)),
                           unproven=tuple(sorted(self.unproven & member_set(self.membership.members))), scheduled=scheduled,
                           in_flight_layout=self._in_flight_layout(paused, scheduled))

    def _in_flight_layout(self, paused: bool, scheduled: tuple[int, int] | None) -> tuple[str, ...]:
        """The members whose plain layout the round in flight follows (ClusterView.in_flight_layout)."""
        p = self.plan
        if p is None or paused or scheduled is not None or self.cfg.train.workers_per_site != 1 \
                or (p.carry and p.start_round == self.committed_round + 1):
            return ()
        return self.membership.members

    def new_epoch(self, plan: Plan, reason: str, now_ns: int, setting: ConsistencySetting | None = None) -> None:
        old_members = set(self.membership.members)
        before, first_epoch = self.settings.current, not self.settings.order
        epoch = self.membership.epoch + 1
        sites = dict(self.membership.sites)
        for s in plan.members:
            sites[s] = replace(sites[s], state=membership.SiteState.ACTIVE)
        held_out: list[tuple[str, int]] = []
        if plan.drain is not None and plan.drain.site in sites:
            # Drained while alive, ahead of its fault: keep it out until a new incarnation joins.
            s = plan.drain.site
            held_out.append((s, sites[s].incarnation))
            self.oracle_dropped.add(held_out[-1])
            sites[s] = replace(sites[s], state=membership.SiteState.FAILED)
        # Checkpoint first: the oracle's drain, or a pause after a preemption notice (restart).
        first = plan.drain is not None or (plan.paused and self.checkpoint_first)
        if plan.paused and self.checkpoint_first:
            self.checkpoint_first = False
        self.recent = after_epoch(self.recent, epoch, plan.members, first)
        if plan.drain is not None:
            self.oracle = self.oracle.after_plan(plan)
        self.membership = membership.Membership(epoch=epoch, members=plan.members, sites=sites)
        # The plan is for the member processes known now: a restarted one must not adopt it (it joins).
        plan = replace(plan, incarnations=tuple((s, sites[s].incarnation) for s in plan.members
                                                if sites[s].incarnation),
                       params_hash=self._committed_params(plan))
        self.plan = plan
        commits.apply_plan_lineage(self, plan)
        if setting is None:
            setting = setting_for_epoch(self.cfg, before, plan.start_round, plan.start_cursor)
        es = self.settings.plan_epoch(epoch, plan.start_round, self.committed_round, setting)
        if plan.start_round <= self.committed_round + 1:  # not a change at a later boundary: a round restarts
            self.settings.on_recovery_epoch(now_ns)
        # Keep the partial reports of every epoch still remembered: the round in flight under an
        # older epoch commits when its last report comes (dropping them lost that round for good).
        self.reports = {k: v for k, v in self.reports.items() if k[0] == epoch or k[0] in self.epoch_members}
        # The previous epoch's members may still report the round they had in flight when this
        # epoch was scheduled; commits.on_round_done decides precisely which of those reports count.
        self.out.append(Fence(self.recent.fence))
        self.out.append(Context({"epoch": epoch}))
        self.out.append(Journal(EpochRecord(epoch, plan, reason, tuple(held_out), first, es.setting, es.start_step,
                                            es.prev_mode).to_json()))
        self.emit_epoch(plan, reason, es)
        if es.setting != before and not first_epoch:
            self.emit("setting_changed", old=before.to_json(), new=es.setting.to_json(), start_round=plan.start_round,
                      start_cursor=plan.start_cursor, start_step=es.start_step, reason=reason)
        # Everyone who should know: the new members and the sites that were just removed.
        alive = set(self.membership.sites)
        self.send_plan(sorted((set(plan.members) | old_members) & alive))

    def _committed_params(self, plan: Plan) -> str | None:
        """The parameter hash a restore under `plan` must produce, from the commit record: the frontier
        commit's for a store restore, the commit of the round before `start_round` for a donor's state
        (the donor sends its state at the start of that round). None when nothing is restored or the
        record does not name it. Never the checkpoint's or the donor's own word: a member holding a
        cluster key could otherwise make its own weights the state the cluster recovers to."""
        if plan.restore == Restore.STORE and plan.manifest_hash is not None:
            f = self.frontier
            if f is None or f.manifest_hash != plan.manifest_hash or not f.commit_id:
                return None
            cid = f.commit_id
        elif plan.restore == Restore.DONOR and plan.start_round > 0:
            cid = plan.parent_commit or self.tip
        else:
            return None
        c = next((x for x in reversed(self.commits) if x.commit_id == cid), None)
        if c is None or (plan.restore == Restore.DONOR and c.round != plan.start_round - 1):
            return None
        return c.param_hash

    def emit_epoch(self, plan: Plan, reason: str, es: Any, **extra: Any) -> None:
        self.emit("membership_epoch", members=list(plan.members), paused=plan.paused, start_round=plan.start_round,
                  start_cursor=plan.start_cursor, restore=plan.restore.value, donor=plan.donor,
                  joiners=list(plan.joiners), manifest_hash=plan.manifest_hash, parent_commit=plan.parent_commit,
                  drain=plan.to_json()["drain"], policy=self.policy.value, reason=reason, **es.to_json(), **extra)

    def tick(self, t: Tick, now_ns: int) -> None:
        # Read after the messages: a member heard since its connection closed is no longer listed.
        self.membership = membership.on_connections(self.membership, dict(t.lost))
        if self.claims:
            claims.decide_overdue(self, now_ns)
        self.step_membership(now_ns)
        self._check_complete()

    def step_membership(self, now_ns: int) -> None:
        d, reason = membership.decide(now_ns, self.membership, self.mcfg)
        if reason != self.last_reason:
            self.emit("membership_decision", action=d.action.value, reason=reason, site=d.site or None)
            self.last_reason = reason
        if d.action == membership.Action.FORM_EPOCH:
            self.new_epoch(Plan(d.members, False, 0, 0, Restore.NONE), reason, now_ns)
            return
        if d.action != membership.Action.NONE:
            self.membership = membership.apply(self.membership, d)
            event = {membership.Action.SUSPECT: "site_suspected", membership.Action.CLEAR_SUSPICION: "suspicion_cleared",
                     membership.Action.CONFIRM_FAILED: "site_failed", membership.Action.CONNECTION_LOST: "site_failed"}[d.action]
            self.emit(event, site=d.site, reason=reason)
        if self.membership.epoch == 0 or self.shutdown_sent:
            return
        if now_ns < self.settle_until_ns:
            return  # restarted: the members' resent round reports first (see recover)
        if self.settle_until_ns:
            self.settle_until_ns = 0
            self.emit("recovery_settled", committed_round=self.committed_round, tip=self.tip,
                      reason="restarted from the journal: the members' resent reports had a heartbeat "
                             "timeout to arrive before any new epoch")
        if self.resync:
            self.resync = False
            v = self.view()
            members = tuple(m for m in v.members if m not in v.failed)
            if members:
                self.new_epoch(Plan(members, bool(self.plan and self.plan.paused), self.committed_round + 1,
                                    self.committed_cursor, Restore.NONE),
                               f"resync: every member resumes from the commit record at round {self.committed_round + 1}",
                               now_ns)
                return
        v = self.view()
        plan, why = decide_recovery(v, self.policy)
        if why != self.last_recovery_reason:
            self.emit("recovery_decision", policy=self.policy.value, reason=why, new_epoch=plan is not None)
            self.last_recovery_reason = why
        if plan is not None:
            self.new_epoch(plan, why, now_ns)
            return
        self.step_setting(v, now_ns)

    def step_setting(self, v: ClusterView, now_ns: int) -> None:
        """A due change of the consistency setting (coordinator/settings.py), when nothing else is
        happening: same members, from their own snapshots, at the boundary after the round in flight.
        `v`: the view the recovery decision just read (nothing changed since; one O(N) view per tick)."""
        if v.paused or v.scheduled is not None or set(v.failed) & set(v.members) or v.joiners or not v.members \
                or v.round_samples <= 0:
            return
        cursor = v.committed_cursor + v.round_samples
        if cursor >= self.target:
            return
        d = self.settings.in_cycle(v.committed_round + 1, now_ns)
        if d is not None:
            commits.emit_decision(self, v.committed_round + 1, self.membership.epoch, d)
        change = due_change(self.cfg, self.settings.current, (v.committed_round + 2, cursor), self.settings.decision)
        if change is not None:
            self.new_epoch(Plan(v.members, False, v.committed_round + 2, cursor, Restore.NONE), change[1], now_ns,
                           setting=change[0])

    def _check_complete(self) -> None:
        """Every member done and the target committed: the run is complete; every site is told to stop."""
        members = self.membership.members
        done = members and all(self.membership.sites[s].state == membership.SiteState.DONE for s in members)
        if done and self.committed_cursor >= self.target and not self.shutdown_sent:
            self.emit("run_complete", commits=len(self.commits),
                      useful_tokens=tokens_of_samples(self.cfg, self.committed_cursor), tip=self.tip)
            for s in sorted(self.membership.sites):
                self.out.append(Send(s, "shutdown", {"reason": "all sites done"}, self.membership.epoch))
            self.shutdown_sent = True


# The message kinds and their handlers, looked up once per message.
HANDLERS: dict[str, Callable[[Rules, Received, Any, int], None]] = {
    "join": Rules._on_join, "heartbeat": Rules._on_heartbeat, "round_done": commits.on_round_done,
    "site_done": Rules._on_site_done, "telemetry": Rules._on_telemetry, "preempt_notice": Rules._on_preempt_notice,
    "checkpoint_durable": Rules._on_checkpoint_durable, "peer_unreachable": claims.on_peer_unreachable}
