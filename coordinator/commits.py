"""The commit record: round reports collected per (epoch, round), a round committed when every member
reported the same parameters over a gap-free span of samples, and the lineage a plan branches.

Functions over the coordinator core's working copy (`coordinator/working.py` `WorkingCopy`): they read and
change it and append what the shell must do to its `out`. No I/O, no clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from control.observations import SiteCycle
from coordinator import claims
from coordinator.core_types import RECEIVED, Context, Journal, Received
from coordinator.membership import member_set
from coordinator.recovery import Frontier
from ground.messages import Built, RoundDone
from ground.plans import Plan, Restore
from ground.records import Commit
from ground.schedule import tokens_of_samples

if TYPE_CHECKING:
    from coordinator.working import WorkingCopy

# Members run at most about one round ahead of the commit record; a report further ahead is absurd.
ROUND_WINDOW = 8


def round_reports(w: WorkingCopy, messages: tuple[tuple[str, int, int, str, Any], ...], now_ns: int) -> None:
    """Round reports of one instant, each what `handle` does with it. The common one (a report the
    simulator built, of the current epoch with a plan, from a member, inside the round window, with
    no cycle or a built one, that does not complete its round) is recorded here as `on_round_done`
    records it, with what the reports share (the epoch, its members, the round's maps of reports
    and cycles) read once, and read again after any report that goes through `handle`: the one that
    completes its round (the commit), and any other (checked there; a built report in an announced
    epoch is given to its handler directly)."""
    handle, settings = w.handle, w.settings
    key: tuple[int, int] | None = None  # None: the shared values below are to be read (again)
    for m in messages:
        src, _inc, msg_epoch, kind, body = m
        if key is None:
            epoch, members = w.membership.epoch, w.membership.members
            mset, n, window = member_set(members), len(members), w.committed_round + ROUND_WINDOW
            floor = w.committed_round
            ready = w.plan is not None
            key = (-1, -1)
        built = kind == "round_done" and type(body) is Built and type(r := body.typed) is RoundDone
        if built and ready and msg_epoch == epoch and src in mset and floor < r.round <= window \
                and ((cycle := body.get("cycle")) is None or type(cycle) is SiteCycle):
            if key[1] != r.round:
                key = (epoch, r.round)
                got, cycles = reports_of(w, key), None
            if len(got) + (src not in got) < n:  # (a round's reports come from its members only)
                got[src] = r
                if cycle is not None:  # the controller's evidence (EpochSettings.on_cycle)
                    if cycles is None:
                        cycles = settings.cycles_of(key)
                    cycles[src] = cycle
                continue
        handle(RECEIVED(*m), now_ns, r if built and 0 <= msg_epoch <= w.membership.epoch else None)
        key = None


def on_round_done(w: WorkingCopy, msg: Received, r: RoundDone, _now_ns: int) -> None:
    rnd = r.round
    if rnd > w.committed_round + ROUND_WINDOW:
        w.reject(msg, f"round {rnd} is more than {ROUND_WINDOW} rounds past the commit record "
                      f"({w.committed_round})", round=rnd)
        return
    if rnd <= w.committed_round:
        # Committed already (a commit needs every member's report, so this is a duplicate or a
        # forgery): kept, it would hold a set of reports that can never complete, one per round
        # number an insider cares to send (issue 54: bounded above only).
        w.reject(msg, f"stale: round {rnd} is not past the commit record ({w.committed_round})", round=rnd)
        return
    # The current epoch, or the previous one for the round it still had in flight when a
    # change was scheduled for the next boundary (nothing in flight is thrown away).
    if w.plan is not None and msg.epoch == w.membership.epoch \
            and msg.src in member_set(w.membership.members):
        epoch, members = w.membership.epoch, w.membership.members
    elif (msg.epoch in w.epoch_members and msg.src in member_set(w.epoch_members[msg.epoch])
          and w.plan is not None and rnd < w.plan.start_round and rnd == w.committed_round + 1):
        epoch, members = msg.epoch, w.epoch_members[msg.epoch]
    else:
        w.reject(msg, f"epoch {msg.epoch} is not current {w.membership.epoch} or not a member", round=rnd)
        return
    key = (epoch, rnd)
    got = reports_of(w, key)
    got[msg.src] = r
    # The site's own timings of the cycle: the controller's evidence, never a condition of the commit.
    body = msg.body
    w.settings.on_cycle(epoch, rnd, msg.src, body.get("cycle") if isinstance(body, (dict, Built)) else None)
    # The count first (O(1)); the sets only when it matches (once per round).
    if len(got) != len(members) or set(got) != set(members):
        return
    del w.reports[key]
    try_commit(w, epoch, rnd, members, got, _now_ns)


def reports_of(w: WorkingCopy, key: tuple[int, int]) -> dict[str, RoundDone]:
    """The reports of (epoch, round), this working copy's own to add to (made if none)."""
    got = w.reports.get(key)
    if got is None or key not in w.own_reports:  # copy on write (see __init__)
        got = w.reports[key] = dict(got) if got is not None else {}
        w.own_reports.add(key)
    return got


def try_commit(w: WorkingCopy, epoch: int, rnd: int, members: tuple[str, ...], got: dict[str, RoundDone],
                now_ns: int) -> None:
    hashes = {s: r.param_hash for s, r in got.items()}
    if len(set(hashes.values())) != 1:
        w.emit("commit_refused", round=rnd, reason="parameter hashes differ", hashes=hashes)
        return
    starts = {r.cursor_start for r in got.values()}
    ends = {r.cursor_end for r in got.values()}
    if starts != {w.committed_cursor} or len(ends) != 1:
        # The lineage must cover the samples without a gap or an overlap: resync everyone.
        w.emit("commit_refused", round=rnd, reason=f"cursors {sorted(starts)}..{sorted(ends)} do not "
                                                   f"continue the commit record at {w.committed_cursor}")
        w.resync = True
        return
    first = got[members[0]]
    commit = Commit(commit_id=f"e{epoch}r{rnd}", parent=w.tip, round=rnd, step=first.step, epoch=epoch,
                    members=members, param_hash=first.param_hash, cursor_start=first.cursor_start,
                    cursor_end=first.cursor_end, tokens={s: r.tokens for s, r in got.items()},
                    flops={s: r.flops for s, r in got.items()},
                    useful_tokens=tokens_of_samples(w.cfg, first.cursor_end),
                    setting=es.setting if (es := w.settings.of(epoch)) is not None else None)
    record = commit.to_json()
    w.out.append(Journal(record))  # durable before anyone is told
    w.commits.append(commit)
    advance(w, commit)
    w.out.append(Context({"step": commit.step}))
    w.emit("commit", **{k: v for k, v in record.items() if k != "type"})
    if w.claims:
        claims.refute(w, members)
    pending = w.pending_frontiers.pop((rnd, commit.cursor_end), None)
    if pending is not None:  # its checkpoint was durable before the round committed
        w.set_frontier(Frontier(rnd, commit.cursor_end, pending, commit.commit_id))
    obs, decision = w.settings.after_commit(epoch, rnd, members, now_ns)
    if obs is not None:
        w.emit("cycle_observed", **obs.to_json())
    if decision is not None:
        emit_decision(w, rnd, epoch, decision)


def emit_decision(w: WorkingCopy, rnd: int, epoch: int, decision: Any) -> None:
    """The controller's decision on round `rnd` (after it committed, or while in flight: evidence.in_cycle)."""
    w.emit("controller_decision", round=rnd, commit_epoch=epoch, action=decision.action,
           setting=decision.setting.to_json(), current=w.settings.current.to_json(),
           reason=decision.reason, evidence=decision.evidence)


def advance(w: WorkingCopy, commit: Commit) -> None:
    w.tip = commit.commit_id
    w.committed_round = commit.round
    w.committed_cursor = commit.cursor_end
    w.oracle = w.oracle.after_commit(commit.cursor_end)
    w.unproven -= set(commit.members)  # a commit proves its members held the lineage's state
    w.settings.on_commit(commit.commit_id, commit.step)


def apply_plan_lineage(w: WorkingCopy, plan: Plan) -> None:
    """A restore from the store branches the lineage at the frontier's commit. Whoever gets state
    from elsewhere holds it for sure only once a commit includes it (`unproven`)."""
    if plan.restore == Restore.DONOR:
        w.unproven |= set(plan.joiners)
    if plan.restore == Restore.STORE:
        w.unproven |= set(plan.members)
        w.tip = plan.parent_commit
        w.settings.on_store_restore(plan.parent_commit)
        w.committed_round = plan.start_round - 1
        w.committed_cursor = plan.start_cursor
