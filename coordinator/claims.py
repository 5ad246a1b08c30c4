"""Claims that one member cannot reach another (`peer_unreachable`): when the coordinator acts on one.

A site whose collective hears nothing from a peer for `wan.collective_stall_ms` reports it. Acting on
one member's word alone lets an insider fail every other member, one epoch at a time, and become the
only member and donor. So a claim is corroborated first, by one of:
  * the accused's own claim against the reporter (a cut link stalls both ends' collective),
  * another member's claim against the same site,
  * the coordinator's own evidence: the accused's heartbeat is late by half the heartbeat timeout,
    or its connection closed.
A claim is refuted when a round that both sides are members of commits after it (its collective
finished, so the two did hear each other): it is dropped, not decided.
A claim nobody corroborates or refutes within the heartbeat timeout is decided anyway (the round cannot finish
without the pair), against the accused unless the reporter's claims already failed someone in this
run, then against the reporter: one member's word fails another at most once.

Of two members that claim each other, the one whose claims failed more sites before goes; on a tie,
the one claimed first (as the coordinator acted before, on the first report). Pure functions over the
core's state (coordinator/core_types.py `claims`, `accusations`), no clock of their own; below them, the
rules that act on a claim, over the core's working copy (coordinator/working.py `WorkingCopy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Mapping

from coordinator import membership
from coordinator.core_types import Received
from coordinator.membership import SiteRecord, member_set
from ground.messages import PeerUnreachable

if TYPE_CHECKING:
    from coordinator.working import WorkingCopy

Claims = dict[tuple[str, str], tuple[int, int]]  # (reporter, accused) -> (epoch, received at ns)
Verdict = tuple[str, "str | None", str]  # (the site to fail, whose claim failed it (None: its own), the reason)


def current(claims: Mapping[tuple[str, str], tuple[int, int]], epoch: int) -> Claims:
    """The claims made in this epoch (an older epoch's were about members it no longer has)."""
    return {k: v for k, v in claims.items() if v[0] == epoch}


def own_evidence(accused: SiteRecord, now_ns: int, heartbeat_timeout_ms: int) -> str | None:
    """What the coordinator itself knows that supports a claim against `accused`, or None."""
    if accused.disconnected_ns:
        return "its connection closed"
    late_ms = (now_ns - accused.last_heartbeat_ns) / 1e6
    if late_ms >= heartbeat_timeout_ms / 2:
        return f"no heartbeat for {late_ms:.0f} ms"
    return None


def judge(claims: Mapping[tuple[str, str], tuple[int, int]], accusations: Mapping[str, int], reporter: str,
          accused: str, evidence: str | None) -> Verdict | None:
    """Whether the claim (reporter -> accused), just recorded in `claims`, is corroborated: the verdict, or None."""
    if evidence is not None:
        return accused, reporter, f"{reporter} cannot reach {accused}, and {evidence}"
    if (accused, reporter) in claims:
        # Each claims the other. The one whose claims failed more members before goes; on a tie, the
        # one claimed first.
        mine, theirs = accusations.get(reporter, 0), accusations.get(accused, 0)
        first_claimed = reporter if claims[(accused, reporter)][1] <= claims[(reporter, accused)][1] else accused
        if mine != theirs:
            victim = reporter if mine > theirs else accused
        else:
            victim = first_claimed
        winner = accused if victim == reporter else reporter
        return victim, winner, (f"{reporter} and {accused} cannot reach each other: {victim} goes "
                                f"(claims that failed a site before: {reporter} {mine}, {accused} {theirs})")
    others = sorted(r for (r, a) in claims if a == accused and r != reporter)
    if others:
        return accused, reporter, f"{reporter} cannot reach {accused}, nor can {', '.join(others)}"
    return None


def overdue(claims: Mapping[tuple[str, str], tuple[int, int]], accusations: Mapping[str, int], now_ns: int,
            heartbeat_timeout_ms: int) -> Iterator[Verdict]:
    """Verdicts for the claims older than the heartbeat timeout, oldest first, one per pair of sites."""
    decided: set[str] = set()
    for (reporter, accused), (_epoch, at_ns) in sorted(claims.items(), key=lambda kv: (kv[1][1], kv[0])):
        if (now_ns - at_ns) / 1e6 < heartbeat_timeout_ms or reporter in decided or accused in decided:
            continue
        if accusations.get(reporter, 0) > 0:
            decided.add(reporter)
            yield reporter, None, (f"{reporter}'s claim that it cannot reach {accused} was not corroborated "
                                      f"in {heartbeat_timeout_ms} ms, and its claims failed a site before: "
                                      f"{reporter} goes")
        else:
            decided.add(accused)
            yield accused, reporter, (f"{reporter} cannot reach {accused} (not corroborated in "
                                      f"{heartbeat_timeout_ms} ms; {reporter}'s first claim)")


def refuted_by(claims: Mapping[tuple[str, str], tuple[int, int]],
               members: frozenset[str]) -> tuple[list[tuple[str, str]], Claims]:
    """(the claims a commit of `members` refutes, in order; the claims left): every claim whose reporter
    and accused are both members of the committed round."""
    refuted = sorted(k for k in claims if k[0] in members and k[1] in members)
    return refuted, {k: v for k, v in claims.items() if k not in set(refuted)}


# ---------------------------------------------------------------- the rules acting on claims
def on_peer_unreachable(w: WorkingCopy, msg: Received, p: PeerUnreachable, now_ns: int) -> None:
    if msg.epoch != w.membership.epoch:
        w.reject(msg, f"stale epoch {msg.epoch}")
        return
    sites = w.membership.sites
    if msg.src == p.peer or not (msg.src in w.membership.members and p.peer in w.membership.members
                                 and sites[msg.src].state == membership.SiteState.ACTIVE
                                 and sites[p.peer].state == membership.SiteState.ACTIVE):
        return
    # One member's word does not fail another (an insider would evict every other member, one
    # epoch at a time): the claim waits for corroboration (`judge` above).
    w.claims = current(w.claims, w.membership.epoch)
    w.claims[(msg.src, p.peer)] = (w.membership.epoch, now_ns)
    evidence = own_evidence(sites[p.peer], now_ns, w.mcfg.heartbeat_timeout_ms)
    verdict = judge(w.claims, w.accusations, msg.src, p.peer, evidence)
    if verdict is None:
        w.emit("claim_pending", site=p.peer, reporter=msg.src, detail=p.detail,
               reason=f"{msg.src}'s word alone: waits for {p.peer}'s own report, another member's, the "
                      f"coordinator's evidence, or {w.mcfg.heartbeat_timeout_ms} ms")
        return
    fail_on_claim(w, *verdict)


def fail_on_claim(w: WorkingCopy, victim: str, accuser: str | None, why: str) -> None:
    w.claims = {k: v for k, v in w.claims.items() if victim not in k}
    if accuser is not None:
        w.accusations[accuser] = w.accusations.get(accuser, 0) + 1
    w.membership = membership.set_state(w.membership, victim, "announced_failure")
    w.emit("site_failed", site=victim, reason=why)


def refute(w: WorkingCopy, members: tuple[str, ...]) -> None:
    """A round both sides of a claim were members of committed after the claim: its collective
    finished, so the reporter did hear from the accused; the claim is dropped, never decided (an
    insider that keeps training while it claims would otherwise fail one honest member per run)."""
    refuted, kept = refuted_by(w.claims, member_set(members))
    w.claims = kept
    for reporter, accused in refuted:
        w.emit("claim_refuted", site=accused, reporter=reporter,
               reason=f"a round with {reporter} and {accused} committed after {reporter}'s claim")


def decide_overdue(w: WorkingCopy, now_ns: int) -> None:
    """A claim nobody corroborated within the heartbeat timeout is decided (tick): the run must go on."""
    w.claims = current(w.claims, w.membership.epoch)
    for verdict in overdue(w.claims, w.accusations, now_ns, w.mcfg.heartbeat_timeout_ms):
        victim = verdict[0]
        if victim in w.membership.members and w.membership.sites[victim].state == membership.SiteState.ACTIVE:
            fail_on_claim(w, *verdict)
