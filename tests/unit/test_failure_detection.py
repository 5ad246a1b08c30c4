"""A lost connection is evidence of failure too (issue 9: failover within 1 s): the rule.

The rule (coordinator/membership.py) on a virtual clock: a member whose connection to the
coordinator closed and who sent nothing since is failed after `disconnect_grace_ms`; one heard
again within the grace is not. The evidence itself on real sockets: tests/live/test_failure_detection.py.
"""

from __future__ import annotations

from coordinator import membership

MS = 1_000_000
CFG = membership.MembershipConfig(expected_sites=("a", "b", "c"), heartbeat_timeout_ms=2000, disconnect_grace_ms=300)


def cluster(t_ns: int = 0) -> membership.Membership:
    sites = {s: membership.SiteRecord(s, membership.SiteState.ACTIVE, t_ns, 1) for s in ("a", "b", "c")}
    return membership.Membership(epoch=1, members=("a", "b", "c"), sites=sites)


def test_a_closed_connection_and_silence_for_the_grace_fails_the_member() -> None:
    m = membership.on_connections(cluster(0), {"b": 100 * MS})  # b's connection closed at 100 ms
    assert membership.decide(399 * MS, m, CFG)[0].action == membership.Action.NONE  # 299 ms: within the grace
    d, why = membership.decide(401 * MS, m, CFG)
    assert d == membership.Decision(membership.Action.CONNECTION_LOST, site="b") and "grace 300 ms" in why
    assert membership.apply(m, d).sites["b"].state == membership.SiteState.FAILED
    assert membership.apply(m, d).sites["a"].state == membership.SiteState.ACTIVE


def test_a_member_heard_again_within_the_grace_is_not_failed() -> None:
    m = membership.on_connections(cluster(0), {"b": 100 * MS})
    m = membership.on_heartbeat(membership.on_connections(m, {}), "b", 250 * MS)  # reconnected and heartbeated
    assert m.sites["b"].disconnected_ns == 0
    for t in (401, 1000, 1999):  # (a and c go silent at 2000 ms: the heartbeat rule, not this one)
        assert membership.decide(t * MS, m, CFG)[0].action == membership.Action.NONE, t


def test_silence_alone_still_needs_the_heartbeat_timeout() -> None:
    m = cluster(0)  # a hung process keeps its connection: only the heartbeat timeout sees it
    assert membership.decide(1999 * MS, m, CFG)[0].action == membership.Action.NONE
    assert membership.decide(2001 * MS, m, CFG)[0] == membership.Decision(membership.Action.SUSPECT, site="a")


def test_a_suspect_whose_connection_closes_is_failed_after_the_grace() -> None:
    m = membership.apply(cluster(0), membership.Decision(membership.Action.SUSPECT, site="a"))
    m = membership.on_connections(m, {"a": 2500 * MS})
    assert membership.decide(2801 * MS, m, CFG)[0] == membership.Decision(membership.Action.CONNECTION_LOST, site="a")
    assert membership.apply(m, membership.Decision(membership.Action.CONNECTION_LOST, site="a")).sites["a"].state == membership.SiteState.FAILED


def test_the_rule_is_off_at_grace_zero_and_ignores_done_sites_and_non_members() -> None:
    lost = membership.on_connections(cluster(10**12), {"b": 100 * MS})
    off = membership.MembershipConfig(**{**CFG.__dict__, "disconnect_grace_ms": 0})
    assert membership.decide(10**12, lost, off)[0].action == membership.Action.NONE
    done = membership.on_done(lost, "b")  # finished its work and exited: its connection closes, as it should
    assert membership.decide(10**12, done, CFG)[0].action == membership.Action.NONE
    out = membership.Membership(epoch=2, members=("a", "c"), sites=lost.sites)  # b is not a member any more
    assert membership.decide(10**12, out, CFG)[0].action == membership.Action.NONE


def test_connection_evidence_replaces_the_previous_one() -> None:
    m = membership.on_connections(cluster(0), {"a": 5, "c": 7})
    assert (m.sites["a"].disconnected_ns, m.sites["b"].disconnected_ns, m.sites["c"].disconnected_ns) == (5, 0, 7)
    m2 = membership.on_connections(m, {"c": 9})
    assert (m2.sites["a"].disconnected_ns, m2.sites["c"].disconnected_ns) == (0, 9)
    assert membership.on_connections(m2, {"c": 9}) is m2  # nothing changed: the same state


def test_the_load_benchmark_counts_any_decision_about_a_live_site_as_a_false_suspicion() -> None:
    from bench.heartbeat_under_load import detector_suspicions

    healthy = [(t * MS, (t - t % 200) * MS, 0) for t in range(0, 5000, 10)]  # a heartbeat every 200 ms
    assert detector_suspicions(healthy, CFG) == []
    blip = [(t * MS, 0, 100 * MS if t < 250 else 0) for t in range(100, 400, 10)]  # heard again at 250 ms
    assert detector_suspicions(blip, CFG) == []
    lost = [(t * MS, 0, 100 * MS) for t in range(100, 500, 10)]  # still unheard 400 ms after the close
    reasons = detector_suspicions(lost, CFG)
    assert len(reasons) == 9 and all("connection closed" in r for r in reasons)  # 410..490 ms
