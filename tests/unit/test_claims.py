"""A member's claim that it cannot reach another (`peer_unreachable`) fails that member only when it
is corroborated (coordinator/claims.py, issue 54): one insider's word does not evict the others.
Scenario tests on the coordinator's pure core and a virtual clock (heartbeat timeout 1000 ms)."""

from __future__ import annotations

from coordinator import core
from tests.unit.test_coordinator_core import SITES, Clock, commit_round, config, formed, received


def claim(c: Clock, src: str, peer: str, after_ms: int = 0) -> None:
    c.feed(received("peer_unreachable", src, {"peer": peer, "detail": f"nothing from [{peer!r}]"},
                    c.state.membership.epoch), after_ms=after_ms)


def failed(c: Clock) -> list[tuple[str, str]]:
    return [(e["site"], e["reason"]) for e in c.emitted("site_failed")]


def alive(c: Clock, ms: int) -> None:
    """Every member heartbeats, then `ms` of virtual time pass and the coordinator ticks."""
    c.heartbeats(SITES, c.state.membership.epoch)
    c.feed(core.Tick(), after_ms=ms)


def test_one_members_word_alone_fails_nobody_and_says_what_it_waits_for() -> None:
    c = formed(config())
    alive(c, 100)
    claim(c, "a", "b")
    assert failed(c) == []
    (pending,) = c.emitted("claim_pending")
    assert (pending["site"], pending["reporter"]) == ("b", "a") and "waits for b's own report" in pending["reason"]


def test_a_cut_link_is_claimed_from_both_ends_and_the_site_claimed_first_goes() -> None:
    c = formed(config())
    alive(c, 100)
    claim(c, "a", "c")
    claim(c, "c", "a", after_ms=5)
    ((site, why),) = failed(c)
    assert site == "c" and "a and c cannot reach each other" in why.replace("c and a", "a and c")


def test_two_members_that_cannot_reach_the_same_one_fail_it() -> None:
    c = formed(config())
    alive(c, 100)
    claim(c, "a", "c")
    claim(c, "b", "c", after_ms=5)
    ((site, why),) = failed(c)
    assert site == "c" and why == "b cannot reach c, nor can a"


def test_the_coordinators_own_evidence_corroborates_a_claim_at_once() -> None:
    c = formed(config())
    alive(c, 100)
    c.heartbeats(("a", "b"), 1)  # c has been quiet since: 600 ms is over half the timeout
    c.feed(core.Tick(), after_ms=600)
    claim(c, "a", "c")
    ((site, why),) = failed(c)
    assert site == "c" and why.startswith("a cannot reach c, and no heartbeat for")


def test_an_uncorroborated_claim_is_decided_after_the_heartbeat_timeout_once_per_reporter() -> None:
    c = formed(config())
    alive(c, 100)
    claim(c, "a", "b")
    for _ in range(3):
        alive(c, 300)  # everyone heartbeats; nobody corroborates
    assert failed(c) == []
    alive(c, 300)  # 1,200 ms after the claim
    ((site, why),) = failed(c)
    assert site == "b" and "a's first claim" in why
    # a accuses again, in whatever epoch comes next, and again nobody corroborates: now a goes
    alive(c, 100)
    claim(c, "a", "c")
    for _ in range(5):
        alive(c, 300)
    assert failed(c)[-1][0] == "a" and "its claims failed a site before" in failed(c)[-1][1]


def test_an_insider_that_claims_every_epoch_is_the_one_that_goes_the_second_time() -> None:
    """b (the insider) claims a, then a claims b: a tie in past claims, a was claimed first, a goes and
    b's claims have now failed a site. When b and c next claim each other, b goes, although c was
    claimed first."""
    c = formed(config())
    alive(c, 100)
    claim(c, "b", "a")
    claim(c, "a", "b", after_ms=5)
    assert [s for s, _ in failed(c)] == ["a"]
    assert c.state.accusations == {"b": 1}
    alive(c, 100)
    claim(c, "b", "c")
    claim(c, "c", "b", after_ms=5)
    assert [s for s, _ in failed(c)] == ["a", "b"]
    assert "claims that failed a site before: c 0, b 1" in failed(c)[-1][1]


def test_a_claim_refuted_by_a_later_commit_of_both_sites_is_dropped_and_fails_nobody() -> None:
    """c (the insider) keeps training while it claims it cannot reach a: the round with a and c commits
    after the claim, so c did hear from a; the claim is dropped and never decided, and a claim made
    after that commit still waits as before."""
    c = formed(config())
    alive(c, 100)
    claim(c, "c", "a")
    commit_round(c, 0, 0, 96, SITES, 1)
    (refuted,) = c.emitted("claim_refuted")
    assert (refuted["site"], refuted["reporter"]) == ("a", "c") and c.state.claims == {}
    for _ in range(6):
        alive(c, 300)  # far past the heartbeat timeout: nothing left to decide
    assert failed(c) == [] and c.state.accusations == {}
    claim(c, "c", "b")
    assert [e["site"] for e in c.emitted("claim_pending")] == ["a", "b"] and failed(c) == []
