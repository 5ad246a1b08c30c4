"""A coordinator restarted from its journal: the state the journal's records prove, rebuilt on the
core's working copy (`coordinator/rules.py` `Rules`), and what the restarted process must announce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coordinator import commits, membership
from coordinator.core_types import Context, Fence
from coordinator.recovery import Frontier
from coordinator.replay import pending_checkpoints, recent_epochs
from ground.records import Commit, EpochRecord

if TYPE_CHECKING:
    from coordinator.rules import Rules


def recover(w: Rules, records: list[dict[str, Any]], problem: str | None, now: int,
            logged_epochs: frozenset[int] | None = None) -> None:
    """The state the journal's records prove. `logged_epochs`: the epochs the previous incarnation's
    log announced (None: not known); the journal's last epoch, if the log lacks it, is logged now."""
    if problem:
        w.emit("journal_torn_tail", detail=problem)
    last_epoch: EpochRecord | None = None
    for r in records:
        if r["type"] == "commit":
            commit = Commit.from_json(r)
            w.commits.append(commit)
            commits.advance(w, commit)
        elif r["type"] == "epoch":
            rec = last_epoch = EpochRecord.from_json(r)
            plan = rec.plan
            w.plan = plan
            w.oracle = w.oracle.after_plan(plan)
            w.oracle_dropped |= set(rec.held_out)
            # The members' incarnations as the epoch named them: a restarted member's join is then
            # told apart from its previous incarnation's heartbeats (0 where the plan names none).
            incs = dict(plan.incarnations)
            sites = {s: membership.SiteRecord(s, membership.SiteState.ACTIVE if s in plan.members
                                              else membership.SiteState.FAILED, now, incs.get(s, 0))
                     for s in w.cfg.cluster.sites}
            w.membership = membership.Membership(epoch=rec.epoch, members=plan.members, sites=sites)
            commits.apply_plan_lineage(w, plan)
            w.settings.replay_epoch(rec.epoch, rec.setting, rec.start_step, rec.prev_mode, plan.start_round)
        elif r["type"] == "frontier":
            w.frontier = Frontier(r["round"], r["cursor"], r["manifest_hash"], r.get("commit_id"))
    w.recent = recent_epochs(records)
    w.pending_frontiers = {k: v for k, v in pending_checkpoints(records).items()
                           if w.frontier is None or k[0] > w.frontier.round}
    w.out.append(Fence(w.recent.fence))
    if records:
        # Members kept training while we were down; their reports of those rounds come again
        # (reliable messages are resent on reconnect). A decision taken before they arrive
        # would roll the members back past rounds they no longer hold snapshots of.
        w.settle_until_ns = now + w.mcfg.heartbeat_timeout_ms * 1_000_000
        w.out.append(Context({"epoch": w.membership.epoch}))
        w.emit("coordinator_recovered", records=len(records), epoch=w.membership.epoch,
               members=list(w.membership.members), commits=len(w.commits), tip=w.tip,
               committed_cursor=w.committed_cursor,
               recent_epochs={str(e): list(m) for e, m in w.epoch_members.items()},
               fence_epoch=w.recent.fence,
               pending_checkpoints=[[r, c] for r, c in sorted(w.pending_frontiers)])
    if last_epoch is not None and logged_epochs is not None and last_epoch.epoch not in logged_epochs:
        # Killed between journaling the epoch and logging it (the journal is durable first): nobody
        # was told of it then (the sends come after the log line); it is announced now, so the log
        # names it before anyone acts in it (soak seed 1005, oracle: commits in an epoch the
        # history never announced).
        es = w.settings.of(last_epoch.epoch)
        assert es is not None
        w.emit_epoch(last_epoch.plan, last_epoch.reason, es, recovered_from_journal=True)
