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
from coordinator.recovery import (ClusterView, Frontier, Plan, Policy, Restore, checkpoint_before_waiting,
                                  decide_recovery)
from wan.frames import Message, TrafficClass
from wan.node import WanNode
from site_agent.schedule import samples_per_round, target_samples
from xdc.config import RunConfig, config_from_json
from xdc.eventlog import EventLog
from xdc.topology import COORD, Topology

CONTROL = TrafficClass.CONTROL.value


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
                                        failure_confirm_ms=cfg.recovery.failure_confirm_ms)
        self.target = target_samples(cfg)
        self.m = mb.Membership()
        self.plan: Plan | None = None
        self.prev: tuple[int, tuple[str, ...]] | None = None  # (epoch, members) before the current epoch
        self.epoch_members: dict[int, tuple[str, ...]] = {}  # recent epochs, for reports of rounds in flight
        self.checkpoint_first_epoch = -1
        self.oracle_applied: set[str] = set()  # sites the oracle already drained (once per scenario fault)
        self.resync = False
        self.checkpoint_first = False  # the next pause asks the leader to checkpoint first (preemption)
        self.commits: list[dict[str, Any]] = []
        self.tip: str | None = None  # the newest commit of the current lineage
        self.committed_round = -1
        self.committed_cursor = 0
        self.frontier: Frontier | None = None
        self.oracle_dropped: set[tuple[str, int]] = set()
        self.reports: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
        self.hb_stats: dict[str, dict[str, float]] = {}
        self.last_reason = ""
        self.last_recovery_reason = ""
        self.stop = False
        self.shutdown_sent = False
        self.journal_path = run_dir / "coordinator" / "journal.jsonl"
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
                plan = Plan(**{**r["plan"], "members": tuple(r["plan"]["members"]),
                               "joiners": tuple(r["plan"]["joiners"]), "restore": Restore(r["plan"]["restore"])})
                self.plan = plan
                sites = {s: mb.Site(s, mb.SiteState.ACTIVE if s in plan.members else mb.SiteState.FAILED, now)
                         for s in self.cfg.cluster.sites}
                self.m = mb.Membership(epoch=r["epoch"], members=plan.members, sites=sites)
                self._apply_plan_lineage(plan)
            elif r["type"] == "frontier":
                self.frontier = Frontier(r["round"], r["cursor"], r["manifest_hash"], r.get("commit_id"))
        if records:
            self.log.set_context(epoch=self.m.epoch)
            self.log.emit("coordinator_recovered", records=len(records), epoch=self.m.epoch,
                          members=list(self.m.members), commits=len(self.commits), tip=self.tip,
                          committed_cursor=self.committed_cursor)

    def _advance(self, commit: dict[str, Any]) -> None:
        self.tip = commit["commit_id"]
        self.committed_round = commit["round"]
        self.committed_cursor = commit["cursor_end"]

    def _apply_plan_lineage(self, plan: Plan) -> None:
        """A restore from the store branches the lineage at the frontier's commit."""
        if plan.restore == Restore.STORE:
            self.tip = plan.parent_commit
            self.committed_round = plan.start_round - 1
            self.committed_cursor = plan.start_cursor

    # ------------------------------------------------------------------ handlers
    def on_message(self, msg: Message, now_ns: int) -> None:
        kind = msg.kind
        if kind == "join":
            if (msg.src, msg.inc) in self.oracle_dropped:
                self.log.emit("join_deferred", site=msg.src, reason="oracle dropped this incarnation before its fault")
                return
            before = self.m.sites.get(msg.src)
            if msg.body.get("rejoin") and msg.src in self.m.members:
                # A member lost its state (a restore failed): it leaves and comes back as a joiner.
                self.m = mb.set_state(self.m, msg.src, "removed")
            self.m = mb.on_join(self.m, msg.src, now_ns, msg.inc)
            self.log.emit("site_joined", site=msg.src, incarnation=msg.inc, pid=msg.body.get("pid"),
                          state=self.m.sites[msg.src].state.value,
                          previous_state=before.state.value if before else None)
            if self.m.epoch > 0 and msg.src in self.m.members and self.m.sites[msg.src].state == mb.SiteState.ACTIVE:
                self.send_plan([msg.src])  # a lost reply: tell it again
        elif kind == "heartbeat":
            self.m = mb.on_heartbeat(self.m, msg.src, now_ns, 0)
            st = self.hb_stats.setdefault(msg.src, {"n": 0, "max_delay_ms": 0.0, "max_gap_ms": 0.0, "last_ns": 0})
            delay_ms = (now_ns - int(msg.body.get("sent_mono_ns", now_ns))) / 1e6
            if st["last_ns"]:
                st["max_gap_ms"] = max(st["max_gap_ms"], (now_ns - st["last_ns"]) / 1e6)
            st["last_ns"] = now_ns
            st["n"] += 1
            st["max_delay_ms"] = max(st["max_delay_ms"], delay_ms)
            # A member we removed is still alive (it hung, or was partitioned): tell it, so it rejoins.
            site = self.m.sites.get(msg.src)
            if site is not None and self.m.epoch > 0 and msg.src not in self.m.members \
                    and int(msg.body.get("epoch", 0)) not in (0, self.m.epoch) and site.state == mb.SiteState.FAILED:
                self.send_plan([msg.src])
        elif kind == "round_done":
            self.on_round_done(msg)
        elif kind == "site_done":
            if msg.epoch == self.m.epoch and msg.src in self.m.members:
                self.m = mb.on_done(self.m, msg.src)
                self.log.emit("site_done", site=msg.src, round=msg.body.get("round"))
        elif kind == "telemetry":
            self.log.emit("site_metrics", site=msg.src, **{k: v for k, v in msg.body.items() if k != "site"})
        elif kind == "preempt_notice":
            first, why = checkpoint_before_waiting(self.policy)
            self.log.emit("preemption_notice", site=msg.src, grace_s=msg.body.get("grace_s"),
                          checkpoint_first=first, reason=why)
            self.checkpoint_first = first
            self.m = mb.set_state(self.m, msg.src, "announced_failure")
            self.log.emit("site_failed", site=msg.src, reason="announced its preemption")
        elif kind == "checkpoint_durable":
            if msg.epoch != self.m.epoch and msg.epoch not in self.epoch_members:
                self.log.emit("report_rejected", site=msg.src, kind=kind, reason=f"stale epoch {msg.epoch}")
                return
            b = msg.body
            commit = next((c["commit_id"] for c in reversed(self.commits)
                           if c["round"] == b["round"] and c["cursor_end"] == b["cursor"]), None)
            self.frontier = Frontier(int(b["round"]), int(b["cursor"]), str(b["manifest_hash"]), commit)
            self.journal.append({"type": "frontier", **asdict(self.frontier)})
            self.log.emit("frontier", **asdict(self.frontier))
        elif kind == "peer_unreachable":
            peer = str(msg.body.get("peer"))
            if msg.epoch != self.m.epoch:
                self.log.emit("report_rejected", site=msg.src, kind=kind, reason=f"stale epoch {msg.epoch}")
                return
            if msg.src in self.m.members and peer in self.m.members and self.m.sites[msg.src].state == mb.SiteState.ACTIVE:
                # Tie-break for a partition reported from both sides: drop the larger name.
                victim = max(peer, msg.src) if msg.body.get("mutual") else peer
                self.m = mb.set_state(self.m, victim, "announced_failure")
                self.log.emit("site_failed", site=victim, reason=f"{msg.src} cannot reach {peer}: {msg.body.get('detail')}")

    def on_round_done(self, msg: Message) -> None:
        b = msg.body
        rnd = int(b["round"])
        # The current epoch, or the previous one for the round it still had in flight when a
        # change was scheduled for the next boundary (nothing in flight is thrown away).
        if self.plan is not None and msg.epoch == self.m.epoch and msg.src in self.m.members:
            epoch, members = self.m.epoch, self.m.members
        elif (msg.epoch in self.epoch_members and msg.src in self.epoch_members[msg.epoch]
              and self.plan is not None and rnd < self.plan.start_round and rnd == self.committed_round + 1):
            epoch, members = msg.epoch, self.epoch_members[msg.epoch]
        else:
            self.log.emit("report_rejected", site=msg.src, round=rnd,
                          reason=f"epoch {msg.epoch} is not current {self.m.epoch} or not a member")
            return
        key = (epoch, rnd)
        self.reports.setdefault(key, {})[msg.src] = b
        got = self.reports[key]
        if set(got) != set(members):
            return
        del self.reports[key]
        hashes = {s: r["param_hash"] for s, r in got.items()}
        if len(set(hashes.values())) != 1:
            self.log.emit("commit_refused", round=rnd, reason="parameter hashes differ", hashes=hashes)
            return
        starts = {int(r["cursor_start"]) for r in got.values()}
        if starts != {self.committed_cursor}:
            # The lineage must cover the samples without a gap or an overlap: resync everyone.
            self.log.emit("commit_refused", round=rnd, reason=f"cursor {sorted(starts)} does not continue the "
                                                              f"commit record at {self.committed_cursor}")
            self.resync = True
            return
        first = got[members[0]]
        record = {
            "type": "commit",
            "commit_id": f"e{epoch}r{rnd}",
            "parent": self.tip,
            "round": rnd,
            "step": int(first["step"]),
            "epoch": epoch,
            "members": list(members),
            "param_hash": next(iter(hashes.values())),
            "cursor_start": int(first["cursor_start"]),
            "cursor_end": int(first["cursor_end"]),
            "tokens": {s: int(r["tokens"]) for s, r in got.items()},
            "flops": {s: float(r["flops"]) for s, r in got.items()},
        }
        record["useful_tokens"] = record["cursor_end"] * self.cfg.model.seq_len
        self.journal.append(record)  # durable before anyone is told
        self.commits.append(record)
        self._advance(record)
        self.log.set_context(step=record["step"])
        self.log.emit("commit", **{k: v for k, v in record.items() if k != "type"})

    def send_plan(self, to: list[str]) -> None:
        if self.plan is None:
            return
        body = {"epoch": self.m.epoch, **asdict(self.plan), "target_samples": self.target,
                "frontier_manifest": self.frontier.manifest_hash if self.frontier else None}
        body["restore"] = self.plan.restore.value
        # Checkpoint first: a preemption notice under restart (the paused survivors' leader), or the
        # oracle's drain before a fault (the continuing members' leader), for this epoch only.
        body["checkpoint_first"] = bool(self.checkpoint_first_epoch == self.m.epoch
                                        and (self.plan.paused or self.policy == Policy.ORACLE))
        for s in to:
            self.node.send(s, "membership", CONTROL, body, epoch=self.m.epoch)

    # ------------------------------------------------------------------ decisions
    def view(self) -> ClusterView:
        # A member back in JOINING asked to rejoin: for the current epoch it is as good as failed.
        failed = tuple(s for s, st in self.m.sites.items() if st.state == mb.SiteState.FAILED
                       or (s in self.m.members and st.state == mb.SiteState.JOINING))
        joiners = tuple(sorted(s for s, st in self.m.sites.items()
                               if st.state == mb.SiteState.JOINING and s not in self.m.members))
        drops = tuple((site, -(-tokens // self.cfg.model.seq_len)) for site, tokens in self.cfg.recovery.oracle_faults
                      if site not in self.oracle_applied)
        paused = bool(self.plan and self.plan.paused)
        return ClusterView(expected=tuple(self.cfg.cluster.sites), epoch=self.m.epoch, members=self.m.members,
                           paused=paused, failed=failed, joiners=joiners,
                           committed_round=self.committed_round, committed_cursor=self.committed_cursor,
                           frontier=self.frontier, target_samples=self.target, drop_before=drops,
                           round_samples=0 if paused else samples_per_round(self.cfg, len(self.m.members)))

    def new_epoch(self, plan: Plan, reason: str) -> None:
        old_members = set(self.m.members)
        epoch = self.m.epoch + 1
        sites = dict(self.m.sites)
        for s in plan.members:
            sites[s] = replace(sites[s], state=mb.SiteState.ACTIVE)
        for s in old_members - set(plan.members):
            if self.policy == Policy.ORACLE and sites[s].state in (mb.SiteState.ACTIVE, mb.SiteState.SUSPECT):
                # Dropped while alive, ahead of its fault: keep it out until a new incarnation joins.
                self.oracle_dropped.add((s, sites[s].incarnation))
                sites[s] = replace(sites[s], state=mb.SiteState.FAILED)
        self.prev = (self.m.epoch, self.m.members) if self.m.epoch > 0 else None
        if self.prev:
            self.epoch_members[self.prev[0]] = self.prev[1]
            self.epoch_members = {e: m for e, m in self.epoch_members.items() if e >= epoch - 4}
        if self.policy == Policy.ORACLE and "drained and dropped" in reason:
            self.oracle_applied |= set(old_members) - set(plan.members)
            self.checkpoint_first_epoch = epoch
        self.m = mb.Membership(epoch=epoch, members=plan.members, sites=sites)
        self.plan = plan
        if plan.paused and self.checkpoint_first:
            self.checkpoint_first_epoch, self.checkpoint_first = epoch, False
        self._apply_plan_lineage(plan)
        self.reports = {k: v for k, v in self.reports.items() if k[0] >= epoch - 1}
        # The previous epoch's members may still report the round they had in flight when this
        # epoch was scheduled; on_round_done decides precisely which of those reports count.
        self.node.set_fence(min(self.epoch_members) if self.epoch_members else epoch)
        self.log.set_context(epoch=epoch)
        self.journal.append({"type": "epoch", "epoch": epoch, "plan": {**asdict(plan), "restore": plan.restore.value},
                             "reason": reason})
        self.log.emit("membership_epoch", members=list(plan.members), paused=plan.paused,
                      start_round=plan.start_round, start_cursor=plan.start_cursor, restore=plan.restore.value,
                      donor=plan.donor, joiners=list(plan.joiners), manifest_hash=plan.manifest_hash,
                      parent_commit=plan.parent_commit, policy=self.policy.value, reason=reason)
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
                     mb.Action.CONFIRM_FAILED: "site_failed"}[d.action]
            self.log.emit(event, site=d.site, reason=reason)
        if self.m.epoch == 0 or self.shutdown_sent:
            return
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
                self.on_message(msg, time.monotonic_ns())
                while True:  # drain what else is queued before deciding
                    self.on_message(self.q.get_nowait(), time.monotonic_ns())
            except queue.Empty:
                pass
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
