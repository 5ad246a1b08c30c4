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
core's state (coordinator/core_types.py `claims`, `accusations`); no clock of their own.
"""

from __future__ import annotations

from typing import Iterator, Mapping

from coordinator.membership import SiteRecord

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
