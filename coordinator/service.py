"""The coordinator process: membership epochs, failure detection, recovery, and the commit record.

`python -m coordinator.service --run-dir RUN` reads the run's config and topology, binds its
ROUTER (sites reach it only through their `<site>_to_coord` proxies) and loops:
  receive -> update state -> decide (pure: `membership.decide` for liveness,
  `recovery.decide_recovery` for epochs) -> apply -> log the reason when it changes.

A round commits when every member of the current epoch reported it with the same parameter
hash; the commit record goes to the durable journal before it is logged. Every epoch's plan
(members, pause or train, resume round and sample cursor, where state comes from) is
journaled and sent to the sites. On restart the coordinator rebuilds its state from the
journal, so the commit record survives a coordinator crash.
"""

from __future__ import annotations

import argparse
import queue
import signal
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from coordinator import membership as mb
from coordinator.journal import Journal
from coordinator.messages import (BadMessage, CheckpointDurable, Heartbeat, Join, PeerUnreachable, PreemptNotice,
                                  RoundDone, SiteDone, Telemetry, parse)
from coordinator.recovery import (ClusterView, Frontier, OracleFaults, Plan, Policy, Restore,
                                  checkpoint_before_waiting, decide_recovery)
from coordinator.replay import RecentEpochs, after_epoch, pending_checkpoints, recent_epochs
from coordinator.settings import EpochSettings, due_change, setting_for_epoch
from control.setting import ConsistencySetting
from wan.frames import Message, TrafficClass
from wan.node import WanNode
from site_agent.schedule import samples_per_round, target_samples
from xdc.config import RunConfig, config_from_json
from xdc.eventlog import EventLog
from xdc.topology import COORD, Topology

CONTROL = TrafficClass.CONTROL.value
# Members run at most about one round ahead of the commit record; a report further ahead is absurd.
ROUND_WINDOW = 8


class Coordinator:
    def __init__(self, run_dir: Path, cfg: RunConfig, topo: Topology, log: EventLog) -> None:
        self.run_dir, self.cfg, self.topo, self.log = run_dir, cfg, topo, log
        self.node = WanNode(name=COORD, run_id=cfg.run_id, wan=cfg.wan, log=log, bind=topo.bind_for(COORD),
                            server_links=topo.server_links_for(COORD), members=topo.peers_of(COORD),
                            keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
        self.q = self.node.inbox("join", "heartbeat", "round_done", "site_done", "telemetry", "preempt_notice",
                                 "checkpoint_durable", "peer_unreachable")
        self.policy = Policy(cfg.recovery.policy)
        self.mcfg = mb.MembershipConfig(expected_sites=tuple(cfg.cluster.sites),
                                        heartbeat_timeout_ms=cfg.wan.heartbeat_timeout_ms,
                                        failure_confirm_ms=cfg.recovery.failure_confirm_ms,
                                        disconnect_grace_ms=cfg.recovery.disconnect_grace_ms)
        self.target = target_samples(cfg)
        self.m = mb.Membership()
        self.plan: Plan | None = None
        # The recent epochs (for reports of rounds in flight) and the epoch whose leader checkpoints
        # first; rebuilt from the journal on restart exactly as they were (coordinator/replay.py).
        self.recent = RecentEpochs()
        # The faults the oracle sees, and which are spent (drained for, or passed): each fires once.
        self.oracle = OracleFaults(tuple((site, -(-tokens // cfg.model.seq_len))
                                         for site, tokens in cfg.recovery.oracle_faults)
                                   if self.policy == Policy.ORACLE else ())
        self.replanned: set[tuple[str, int, int]] = set()  # (site, incarnation, epoch) re-sent its plan
        self.resync = False
        self.checkpoint_first = False  # the next pause asks the leader to checkpoint first (preemption)
        self.commits: list[dict[str, Any]] = []
        self.tip: str | None = None  # the newest commit of the current lineage
        self.committed_round = -1
        self.committed_cursor = 0
        self.frontier: Frontier | None = None
        self.oracle_dropped: set[tuple[str, int]] = set()  # (site, incarnation) drained ahead of its fault
        # Sites given state from a donor or the store and not yet in a commit since (ClusterView.unproven).
        self.unproven: set[str] = set()
        # After a restart from the journal: no new epoch until the members have had time to resend
        # the round reports they sent while we were down (monotonic ns; 0 = not settling).
        self.settle_until_ns = 0
        # Durable checkpoints of rounds not committed yet: (round, cursor) -> manifest hash.
        self.pending_frontiers: dict[tuple[int, int], str] = {}
        self.reports: dict[tuple[int, int], dict[str, RoundDone]] = {}
        self.hb_stats: dict[str, dict[str, float]] = {}
        self.last_reason = ""
        self.last_recovery_reason = ""
        self.stop = False
        self.shutdown_sent = False
        self.journal_path = run_dir / "coordinator" / "journal.jsonl"
        # Consistency settings per epoch, the commit record's step count, the controller (issue 12).
        self.settings = EpochSettings(cfg)
        self._recover_from_journal()
        self.journal = Journal(self.journal_path)

    # ------------------------------------------------------------------ journal
    def _recover_from_journal(self) -> None:
        records, problem = Journal.load(self.journal_path)
        if problem:
            self.log.emit("journal_torn_tail", detail=problem)
        now = time.monotonic_ns()
        for r in records:
            if r["type"] == "commit":
                self.commits.append(r)
                self._advance(r)
            elif r["type"] == "epoch":
                plan = Plan.from_json(r["plan"])
                self.plan = plan
                self.oracle = self.oracle.after_plan(plan)
                self.oracle_dropped |= {(str(s), int(i)) for s, i in r.get("held_out", [])}
                sites = {s: mb.Site(s, mb.SiteState.ACTIVE if s in plan.members else mb.SiteState.FAILED, now)
                         for s in self.cfg.cluster.sites}
                self.m = mb.Membership(epoch=r["epoch"], members=plan.members, sites=sites)
                self._apply_plan_lineage(plan)
                self.settings.replay_epoch(r["epoch"], r, plan.start_round)
            elif r["type"] == "frontier":
                self.frontier = Frontier(r["round"], r["cursor"], r["manifest_hash"], r.get("commit_id"))
        self.recent = recent_epochs(records)
        self.pending_frontiers = {k: v for k, v in pending_checkpoints(records).items()
                                  if self.frontier is None or k[0] > self.frontier.round}
        self.node.set_fence(self.recent.fence)
        if records:
            # Members kept training while we were down; their reports of those rounds come again
            # (reliable messages are resent on reconnect). A decision taken before they arrive
            # would roll the members back past rounds they no longer hold snapshots of.
            self.settle_until_ns = now + self.mcfg.heartbeat_timeout_ms * 1_000_000
            self.log.set_context(epoch=self.m.epoch)
            self.log.emit("coordinator_recovered", records=len(records), epoch=self.m.epoch,
                          members=list(self.m.members), commits=len(self.commits), tip=self.tip,
                          committed_cursor=self.committed_cursor,
                          recent_epochs={str(e): list(m) for e, m in self.epoch_members.items()},
                          fence_epoch=self.recent.fence,
                          pending_checkpoints=[[r, c] for r, c in sorted(self.pending_frontiers)])

    @property
    def epoch_members(self) -> dict[int, tuple[str, ...]]:
        return self.recent.epoch_members

    @property
    def checkpoint_first_epoch(self) -> int:
        return self.recent.checkpoint_first_epoch

    def _advance(self, commit: dict[str, Any]) -> None:
        self.tip = commit["commit_id"]
        self.committed_round = commit["round"]
        self.committed_cursor = commit["cursor_end"]
        self.oracle = self.oracle.after_commit(commit["cursor_end"])
        self.unproven -= set(commit["members"])  # a commit proves its members held the lineage's state
        self.settings.on_commit(commit)

    def _apply_plan_lineage(self, plan: Plan) -> None:
        """A restore from the store branches the lineage at the frontier's commit. Whoever gets state
        from elsewhere holds it for sure only once a commit includes it (`unproven`)."""
        if plan.restore == Restore.DONOR:
            self.unproven |= set(plan.joiners)
        if plan.restore == Restore.STORE:
            self.unproven |= set(plan.members)
            self.tip = plan.parent_commit
            self.settings.on_store_restore(plan.parent_commit)
            self.committed_round = plan.start_round - 1
            self.committed_cursor = plan.start_cursor

    # ------------------------------------------------------------------ handlers
    def handle(self, msg: Message, now_ns: int) -> None:
        """One received message: validated, then applied. Nothing in a message can stop the loop."""
        try:
            self.on_message(msg, now_ns)
        except BadMessage as e:
            self._reject(msg, f"bad_body: {e}")
        except Exception as e:  # a bug met by one message is logged; the coordinator goes on
            self._reject(msg, f"internal_error: {type(e).__name__}: {str(e)[:500]}")

    def _reject(self, msg: Message, reason: str, **extra: Any) -> None:
        self.log.emit("report_rejected", kind=str(msg.kind)[:64], src=msg.src, site=msg.src, msg_epoch=msg.epoch,
                      reason=reason, **extra)

    def on_message(self, msg: Message, now_ns: int) -> None:
        """Check the epoch and the body against the kind's typed message, then dispatch (BadMessage if bad)."""
        if msg.epoch < 0 or msg.epoch > self.m.epoch:
            # Never announced: no site can be in a later epoch than the coordinator (it journals an
            # epoch before anyone hears of it, and recovers it from the journal after a crash).
            self._reject(msg, f"future_epoch: message epoch {msg.epoch} was never announced "
                              f"(current epoch {self.m.epoch})")
            return
        typed = parse(msg.kind, msg.body)
        handlers = {"join": self._on_join, "heartbeat": self._on_heartbeat, "round_done": self.on_round_done,
                    "site_done": self._on_site_done, "telemetry": self._on_telemetry,
                    "preempt_notice": self._on_preempt_notice, "checkpoint_durable": self._on_checkpoint_durable,
                    "peer_unreachable": self._on_peer_unreachable}
        handlers[msg.kind](msg, typed, now_ns)

    def _on_join(self, msg: Message, j: Join, now_ns: int) -> None:
        if (msg.src, msg.inc) in self.oracle_dropped:
            self.log.emit("join_deferred", site=msg.src, reason="oracle dropped this incarnation before its fault")
            return
        before = self.m.sites.get(msg.src)
        if j.rejoin and msg.src in self.m.members and self._answer_active_rejoin(msg, before):
            return
        if j.rejoin and msg.src in self.m.members:
            # A member lost its state (a restore failed twice): it leaves and comes back as a joiner.
            self.m = mb.set_state(self.m, msg.src, "removed")
        self.m = mb.on_join(self.m, msg.src, now_ns, msg.inc)
        self.log.emit("site_joined", site=msg.src, incarnation=msg.inc, pid=j.pid,
                      state=self.m.sites[msg.src].state.value,
                      previous_state=before.state.value if before else None)
        if self.m.epoch > 0 and msg.src in self.m.members and self.m.sites[msg.src].state == mb.SiteState.ACTIVE:
            self.send_plan([msg.src])  # a lost reply: tell it again

    def _answer_active_rejoin(self, msg: Message, before: mb.Site | None) -> bool:
        """A member asks to be admitted again although it is alive (same incarnation, heartbeating):
        it could not apply a plan (e.g. it skipped an epoch). That is not its death: it gets the
        current plan again. Once per (incarnation, epoch): asking twice in the same epoch means it
        really lost its state, and it is readmitted as a joiner (False)."""
        if before is None or before.incarnation != msg.inc or before.state not in (mb.SiteState.ACTIVE,
                                                                                   mb.SiteState.SUSPECT):
            return False
        key = (msg.src, msg.inc, self.m.epoch)
        if msg.epoch < self.m.epoch:
            why = f"it asked in epoch {msg.epoch}, before it had epoch {self.m.epoch}: sent the current plan"
        elif key not in self.replanned:
            self.replanned.add(key)
            why = (f"an active member (same incarnation) could not apply epoch {self.m.epoch}: it is alive, "
                   f"not failed; sent the current plan again")
        else:
            return False
        self.log.emit("rejoin_answered", site=msg.src, incarnation=msg.inc, msg_epoch=msg.epoch,
                      state=before.state.value, reason=why)
        self.send_plan([msg.src])
        return True

    def _on_heartbeat(self, msg: Message, hb: Heartbeat, now_ns: int) -> None:
        if hb.epoch > self.m.epoch:
            self._reject(msg, f"future_epoch: heartbeat says epoch {hb.epoch}, never announced "
                              f"(current epoch {self.m.epoch})")
            return
        # A coordinator restarted from its journal does not know the members' incarnations (0) until
        # they speak: learn it from the first heartbeat, or a drain would hold out incarnation 0 and
        # readmit the drained, still-live process. A known incarnation is changed only by a join.
        known = self.m.sites.get(msg.src)
        self.m = mb.on_heartbeat(self.m, msg.src, now_ns, msg.inc if known is not None and not known.incarnation else 0)
        st = self.hb_stats.setdefault(msg.src, {"n": 0, "max_delay_ms": 0.0, "max_gap_ms": 0.0, "last_ns": 0})
        delay_ms = (now_ns - hb.sent_mono_ns) / 1e6 if hb.sent_mono_ns is not None else 0.0
        if st["last_ns"]:
            st["max_gap_ms"] = max(st["max_gap_ms"], (now_ns - st["last_ns"]) / 1e6)
        st["last_ns"] = now_ns
        st["n"] += 1
        st["max_delay_ms"] = max(st["max_delay_ms"], delay_ms)
        # A member we removed is still alive (it hung, or was partitioned): tell it, so it rejoins.
        site = self.m.sites.get(msg.src)
        if site is not None and self.m.epoch > 0 and msg.src not in self.m.members \
                and hb.epoch not in (0, self.m.epoch) and site.state == mb.SiteState.FAILED:
            self.send_plan([msg.src])

    def _on_site_done(self, msg: Message, d: SiteDone, _now_ns: int) -> None:
        if msg.epoch == self.m.epoch and msg.src in self.m.members:
            self.m = mb.on_done(self.m, msg.src)
            self.log.emit("site_done", site=msg.src, round=d.round)

    def _on_telemetry(self, msg: Message, t: Telemetry, _now_ns: int) -> None:
        self.log.emit("site_metrics", site=msg.src, metrics=dict(t.metrics))  # nested: no key can collide

    def _on_preempt_notice(self, msg: Message, p: PreemptNotice, _now_ns: int) -> None:
        first, why = checkpoint_before_waiting(self.policy)
        self.log.emit("preemption_notice", site=msg.src, grace_s=p.grace_s, checkpoint_first=first, reason=why)
        self.checkpoint_first = first
        self.m = mb.set_state(self.m, msg.src, "announced_failure")
        self.log.emit("site_failed", site=msg.src, reason="announced its preemption")

    def _on_checkpoint_durable(self, msg: Message, c: CheckpointDurable, _now_ns: int) -> None:
        if msg.epoch != self.m.epoch and msg.epoch not in self.epoch_members:
            self._reject(msg, f"stale epoch {msg.epoch}")
            return
        commit = next((x["commit_id"] for x in reversed(self.commits)
                       if x["round"] == c.round and x["cursor_end"] == c.cursor), None)
        if commit is None:
            # The leader checkpoints a round as soon as its collective is done, before the commit
            # record has it; that round may yet be aborted. Only a committed state may become the
            # frontier the cluster rolls back to (soak seed 1002: a restart rolled everyone back to
            # an uncommitted round 5 and the lineage lost rounds 0-5).
            self.pending_frontiers[(c.round, c.cursor)] = c.manifest_hash
            # Journaled: a restarted coordinator still makes it the frontier when its round commits.
            self.journal.append({"type": "checkpoint_pending", "round": c.round, "cursor": c.cursor,
                                 "manifest_hash": c.manifest_hash})
            self.log.emit("frontier_deferred", round=c.round, cursor=c.cursor, manifest_hash=c.manifest_hash,
                          reason="round not in the commit record yet: becomes the frontier when it commits")
            return
        self._set_frontier(Frontier(c.round, c.cursor, c.manifest_hash, commit))

    def _set_frontier(self, f: Frontier) -> None:
        self.frontier = f
        self.pending_frontiers = {k: v for k, v in self.pending_frontiers.items() if k[0] > f.round}
        self.journal.append({"type": "frontier", **asdict(self.frontier)})
        self.log.emit("frontier", **asdict(self.frontier))

    def _on_peer_unreachable(self, msg: Message, p: PeerUnreachable, _now_ns: int) -> None:
        if msg.epoch != self.m.epoch:
            self._reject(msg, f"stale epoch {msg.epoch}")
            return
        if msg.src in self.m.members and p.peer in self.m.members \
                and self.m.sites[msg.src].state == mb.SiteState.ACTIVE:
            # Tie-break for a partition reported from both sides: drop the larger name.
            victim = max(p.peer, msg.src) if p.mutual else p.peer
            self.m = mb.set_state(self.m, victim, "announced_failure")
            self.log.emit("site_failed", site=victim, reason=f"{msg.src} cannot reach {p.peer}: {p.detail}")

    def on_round_done(self, msg: Message, r: RoundDone, _now_ns: int = 0) -> None:
        rnd = r.round
        if rnd > self.committed_round + ROUND_WINDOW:
            self._reject(msg, f"round {rnd} is more than {ROUND_WINDOW} rounds past the commit record "
                              f"({self.committed_round})", round=rnd)
            return
        # The current epoch, or the previous one for the round it still had in flight when a
        # change was scheduled for the next boundary (nothing in flight is thrown away).
        if self.plan is not None and msg.epoch == self.m.epoch and msg.src in self.m.members:
            epoch, members = self.m.epoch, self.m.members
        elif (msg.epoch in self.epoch_members and msg.src in self.epoch_members[msg.epoch]
              and self.plan is not None and rnd < self.plan.start_round and rnd == self.committed_round + 1):
            epoch, members = msg.epoch, self.epoch_members[msg.epoch]
        else:
            self._reject(msg, f"epoch {msg.epoch} is not current {self.m.epoch} or not a member", round=rnd)
            return
        key = (epoch, rnd)
        self.reports.setdefault(key, {})[msg.src] = r
        self.settings.on_cycle(epoch, rnd, msg.src, msg.body.get("cycle"))
        got = self.reports[key]
        if set(got) != set(members):
            return
        del self.reports[key]
        self._try_commit(epoch, rnd, members, got)

    def _try_commit(self, epoch: int, rnd: int, members: tuple[str, ...], got: dict[str, RoundDone]) -> None:
        hashes = {s: r.param_hash for s, r in got.items()}
        if len(set(hashes.values())) != 1:
            self.log.emit("commit_refused", round=rnd, reason="parameter hashes differ", hashes=hashes)
            return
        starts = {r.cursor_start for r in got.values()}
        ends = {r.cursor_end for r in got.values()}
        if starts != {self.committed_cursor} or len(ends) != 1:
            # The lineage must cover the samples without a gap or an overlap: resync everyone.
            self.log.emit("commit_refused", round=rnd, reason=f"cursors {sorted(starts)}..{sorted(ends)} do not "
                                                              f"continue the commit record at {self.committed_cursor}")
            self.resync = True
            return
        first = got[members[0]]
        record = {
            "type": "commit",
            "commit_id": f"e{epoch}r{rnd}",
            "parent": self.tip,
            "round": rnd,
            "step": first.step,
            "epoch": epoch,
            "members": list(members),
            "param_hash": first.param_hash,
            "cursor_start": first.cursor_start,
            "cursor_end": first.cursor_end,
            "tokens": {s: r.tokens for s, r in got.items()},
            "flops": {s: r.flops for s, r in got.items()},
        }
        record["useful_tokens"] = record["cursor_end"] * self.cfg.model.seq_len
        es = self.settings.of(epoch)
        if es is not None:
            record["setting"] = es.setting.to_json()
        self.journal.append(record)  # durable before anyone is told
        self.commits.append(record)
        self._advance(record)
        self.log.set_context(step=record["step"])
        self.log.emit("commit", **{k: v for k, v in record.items() if k != "type"})
        pending = self.pending_frontiers.pop((rnd, record["cursor_end"]), None)
        if pending is not None:  # its checkpoint was durable before the round committed
            self._set_frontier(Frontier(rnd, record["cursor_end"], pending, record["commit_id"]))
        obs, decision = self.settings.after_commit(epoch, rnd, members)
        if obs is not None:
            self.log.emit("cycle_observed", **obs.to_json())
        if decision is not None:
            self.log.emit("controller_decision", round=rnd, commit_epoch=epoch, action=decision.action, setting=decision.setting.to_json(),
                          current=self.settings.current.to_json(), reason=decision.reason, evidence=decision.evidence)

    def send_plan(self, to: list[str]) -> None:
        if self.plan is None:
            return
        body = {"epoch": self.m.epoch, **self.plan.to_json(), "target_samples": self.target,
                "frontier_manifest": self.frontier.manifest_hash if self.frontier else None}
        # Checkpoint first: a preemption notice under restart (the paused survivors' leader), or the
        # oracle's drain before a fault (the continuing members' leader), for this epoch only.
        body["checkpoint_first"] = bool(self.checkpoint_first_epoch == self.m.epoch
                                        and (self.plan.paused or self.plan.drain is not None))
        es = self.settings.of(self.m.epoch)
        if es is not None:  # the epoch's consistency setting, its start step, the mode before it
            body.update(es.to_json())
        for s in to:
            self.node.send(s, "membership", CONTROL, body, epoch=self.m.epoch)

    # ------------------------------------------------------------------ decisions
    def view(self) -> ClusterView:
        # A member back in JOINING asked to rejoin: for the current epoch it is as good as failed.
        failed = tuple(s for s, st in self.m.sites.items() if st.state == mb.SiteState.FAILED
                       or (s in self.m.members and st.state == mb.SiteState.JOINING))
        joiners = tuple(sorted(s for s, st in self.m.sites.items()
                               if st.state == mb.SiteState.JOINING and s not in self.m.members))
        drops = self.oracle.ahead()
        paused = bool(self.plan and self.plan.paused)
        # The current epoch was scheduled for a boundary the commit record has not reached yet.
        scheduled = ((self.plan.start_round, self.plan.start_cursor)
                     if self.plan is not None and not paused and self.plan.start_round > self.committed_round + 1
                     else None)
        return ClusterView(expected=tuple(self.cfg.cluster.sites), epoch=self.m.epoch, members=self.m.members,
                           paused=paused, failed=failed, joiners=joiners,
                           committed_round=self.committed_round, committed_cursor=self.committed_cursor,
                           frontier=self.frontier, target_samples=self.target, drop_before=drops,
                           round_samples=0 if paused else samples_per_round(self.settings.effective(), len(self.m.members)),
                           unproven=tuple(sorted(self.unproven & set(self.m.members))), scheduled=scheduled)

    def new_epoch(self, plan: Plan, reason: str, setting: ConsistencySetting | None = None) -> None:
        old_members = set(self.m.members)
        before = self.settings.current
        first_epoch = not self.settings.order
        epoch = self.m.epoch + 1
        sites = dict(self.m.sites)
        for s in plan.members:
            sites[s] = replace(sites[s], state=mb.SiteState.ACTIVE)
        held_out: list[tuple[str, int]] = []
        if plan.drain is not None and plan.drain.site in sites:
            # Drained while alive, ahead of its fault: keep it out until a new incarnation joins.
            s = plan.drain.site
            held_out.append((s, sites[s].incarnation))
            self.oracle_dropped.add(held_out[-1])
            sites[s] = replace(sites[s], state=mb.SiteState.FAILED)
        # Checkpoint first: the oracle's drain, or a pause after a preemption notice (restart).
        first = plan.drain is not None or (plan.paused and self.checkpoint_first)
        if plan.paused and self.checkpoint_first:
            self.checkpoint_first = False
        self.recent = after_epoch(self.recent, epoch, plan.members, first)
        if plan.drain is not None:
            self.oracle = self.oracle.after_plan(plan)
        self.m = mb.Membership(epoch=epoch, members=plan.members, sites=sites)
        self.plan = plan
        self._apply_plan_lineage(plan)
        if setting is None:
            setting = setting_for_epoch(self.cfg, before, plan.start_round, plan.start_cursor)
        es = self.settings.plan_epoch(epoch, plan.start_round, self.committed_round, setting)
        # Keep the partial reports of every epoch still remembered: the round in flight under an
        # older epoch commits when its last report comes (dropping them lost that round for good).
        self.reports = {k: v for k, v in self.reports.items() if k[0] == epoch or k[0] in self.epoch_members}
        # The previous epoch's members may still report the round they had in flight when this
        # epoch was scheduled; on_round_done decides precisely which of those reports count.
        self.node.set_fence(self.recent.fence)
        self.log.set_context(epoch=epoch)
        self.journal.append({"type": "epoch", "epoch": epoch, "plan": plan.to_json(), "reason": reason,
                             "held_out": [list(h) for h in held_out], "checkpoint_first": first,
                             **es.to_json()})
        self.log.emit("membership_epoch", members=list(plan.members), paused=plan.paused,
                      start_round=plan.start_round, start_cursor=plan.start_cursor, restore=plan.restore.value,
                      donor=plan.donor, joiners=list(plan.joiners), manifest_hash=plan.manifest_hash,
                      parent_commit=plan.parent_commit, drain=plan.to_json()["drain"], policy=self.policy.value,
                      reason=reason, **es.to_json())
        if es.setting != before and not first_epoch:
            self.log.emit("setting_changed", old=before.to_json(), new=es.setting.to_json(),
                          start_round=plan.start_round, start_cursor=plan.start_cursor, start_step=es.start_step,
                          reason=reason)
        # Everyone who should know: the new members and the sites that were just removed.
        alive = {s for s, st in self.m.sites.items()}
        self.send_plan(sorted((set(plan.members) | old_members) & alive))

    def step_membership(self, now_ns: int) -> None:
        d, reason = mb.decide(now_ns, self.m, self.mcfg)
        if reason != self.last_reason:
            self.log.emit("membership_decision", action=d.action.value, reason=reason, site=d.site or None)
            self.last_reason = reason
        if d.action == mb.Action.FORM_EPOCH:
            self.new_epoch(Plan(d.members, False, 0, 0, Restore.NONE), reason)
            return
        if d.action != mb.Action.NONE:
            self.m = mb.apply(self.m, d)
            event = {mb.Action.SUSPECT: "site_suspected", mb.Action.CLEAR_SUSPICION: "suspicion_cleared",
                     mb.Action.CONFIRM_FAILED: "site_failed", mb.Action.CONNECTION_LOST: "site_failed"}[d.action]
            self.log.emit(event, site=d.site, reason=reason)
        if self.m.epoch == 0 or self.shutdown_sent:
            return
        if now_ns < self.settle_until_ns:
            return  # restarted: the members' resent round reports first (see _recover_from_journal)
        if self.settle_until_ns:
            self.settle_until_ns = 0
            self.log.emit("recovery_settled", committed_round=self.committed_round, tip=self.tip,
                          reason="restarted from the journal: the members' resent reports had a heartbeat "
                                 "timeout to arrive before any new epoch")
        if self.resync:
            self.resync = False
            v = self.view()
            members = tuple(m for m in v.members if m not in v.failed)
            if members:
                self.new_epoch(Plan(members, bool(self.plan and self.plan.paused), self.committed_round + 1,
                                    self.committed_cursor, Restore.NONE),
                               f"resync: every member resumes from the commit record at round {self.committed_round + 1}")
                return
        plan, why = decide_recovery(now_ns, self.view(), self.policy)
        if why != self.last_recovery_reason:
            self.log.emit("recovery_decision", policy=self.policy.value, reason=why, new_epoch=plan is not None)
            self.last_recovery_reason = why
        if plan is not None:
            self.new_epoch(plan, why)
            return
        self.step_setting()

    def step_setting(self) -> None:
        """A due change of the consistency setting (coordinator/settings.py), when nothing else is
        happening: same members, from their own snapshots, at the boundary after the round in flight."""
        v = self.view()
        if v.paused or v.scheduled is not None or set(v.failed) & set(v.members) or v.joiners or not v.members \
                or v.round_samples <= 0:
            return
        cursor = v.committed_cursor + v.round_samples
        if cursor >= self.target:
            return
        change = due_change(self.cfg, self.settings.current, (v.committed_round + 2, cursor), self.settings.decision)
        if change is not None:
            self.new_epoch(Plan(v.members, False, v.committed_round + 2, cursor, Restore.NONE), change[1],
                           setting=change[0])

    def run(self) -> int:
        self.node.start()
        self.log.emit("coordinator_started", expected_sites=list(self.mcfg.expected_sites), policy=self.policy.value,
                      journal_commits=len(self.commits), target_samples=self.target)
        if self.m.epoch > 0:
            self.send_plan(list(self.m.members))  # after a restart: re-announce the current epoch
        last_stats = time.monotonic()
        while not self.stop:
            self.node.check()
            try:
                msg = self.q.get(timeout=0.05)
                self.handle(msg, time.monotonic_ns())
                while True:  # drain what else is queued before deciding
                    self.handle(self.q.get_nowait(), time.monotonic_ns())
            except queue.Empty:
                pass
            # Read after the messages: a member heard since its connection closed is no longer listed.
            self.m = mb.on_connections(self.m, self.node.lost_connections())
            self.step_membership(time.monotonic_ns())
            if time.monotonic() - last_stats >= 1.0:
                last_stats = time.monotonic()
                if self.hb_stats:
                    self.log.emit("heartbeat_stats", sites={k: {kk: vv for kk, vv in v.items() if kk != "last_ns"}
                                                            for k, v in self.hb_stats.items()})
                self.log.emit("wan_counters", counters=self.node.counters.snapshot())
            members = self.m.members
            done = members and all(self.m.sites[s].state == mb.SiteState.DONE for s in members)
            if done and self.committed_cursor >= self.target and not self.shutdown_sent:
                self.log.emit("run_complete", commits=len(self.commits), useful_tokens=self.committed_cursor
                              * self.cfg.model.seq_len, tip=self.tip)
                for s in sorted(self.m.sites):
                    self.node.send(s, "shutdown", CONTROL, {"reason": "all sites done"}, epoch=self.m.epoch)
                self.shutdown_sent = True
                self.node.wait_acked(5.0)
                break
        self.node.close()  # the last counters are read when nothing more can be sent
        self.log.emit("wan_counters", **self.node.final_counters())
        self.log.emit("coordinator_stopped", reason="shutdown" if self.shutdown_sent else "signal")
        self.journal.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coordinator.service", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    cfg = config_from_json(args.run_dir / "config.json")
    topo = Topology.load(args.run_dir / "topology.json")
    log = EventLog(args.run_dir / "logs" / f"{COORD}.jsonl", cfg.run_id, COORD)
    coord = Coordinator(args.run_dir, cfg, topo, log)

    def _stop(signum: int, _frame: Any) -> None:
        log.emit("signal", signal=signal.Signals(signum).name)
        coord.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return coord.run()


if __name__ == "__main__":
    sys.exit(main())
