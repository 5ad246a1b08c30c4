"""The next membership deadline (coordinator/deadline.py) and the service's wait before its next tick.

With a heartbeat timeout of 1,000 ms, a confirmation of 500 ms and a disconnect grace of 300 ms,
each rule's deadline is one ns after its time runs out; the coordinator decides exactly there (the
core, on a virtual clock), and the service waits for messages no longer than until then."""

from __future__ import annotations

from dataclasses import replace

from coordinator import membership as mb
from coordinator.core_types import CoordState
from coordinator.deadline import next_deadline_ns
from coordinator.service import POLL_S, Coordinator

MS = 1_000_000
CFG = mb.MembershipConfig(expected_sites=("a", "b", "c"), heartbeat_timeout_ms=1000, failure_confirm_ms=500,
                          disconnect_grace_ms=300)


def _state(**records: mb.SiteRecord) -> CoordState:
    return CoordState(membership=mb.Membership(epoch=1, members=tuple(records), sites=dict(records)))


def _active(name: str, heard_ms: int, closed_ms: int = 0) -> mb.SiteRecord:
    return mb.SiteRecord(name, mb.SiteState.ACTIVE, heard_ms * MS, disconnected_ns=closed_ms * MS)


def test_a_calm_cluster_waits_for_the_earliest_heartbeat_timeout() -> None:
    s = _state(a=_active("a", 100), b=_active("b", 40), c=_active("c", 70))
    assert next_deadline_ns(s, CFG, 500 * MS) == (1040 * MS + 1, True)
    # b is decided suspect at that instant and not a ns before it
    assert mb.decide(1040 * MS, s.membership, CFG)[0].action == mb.Action.NONE
    assert mb.decide(1040 * MS + 1, s.membership, CFG)[0] == mb.Decision(mb.Action.SUSPECT, site="b")


def test_a_crashed_sites_closed_connection_fails_it_at_the_grace() -> None:
    s = _state(a=_active("a", 900), b=_active("b", 950, closed_ms=1000), c=_active("c", 960))
    deadline, calm = next_deadline_ns(s, CFG, 1010 * MS)
    assert (deadline, calm) == (1300 * MS + 1, False)
    assert mb.decide(deadline - 1, s.membership, CFG)[0].action == mb.Action.NONE
    assert mb.decide(deadline, s.membership, CFG)[0] == mb.Decision(mb.Action.CONNECTION_LOST, site="b")


def test_a_suspect_is_confirmed_after_timeout_and_confirmation() -> None:
    suspect = mb.SiteRecord("c", mb.SiteState.SUSPECT, 0)
    s = _state(a=_active("a", 1500), b=_active("b", 1600), c=suspect)
    assert next_deadline_ns(s, CFG, 1200 * MS) == (1500 * MS + 1, False)


def test_settling_after_a_restart_ends_at_its_own_deadline() -> None:
    s = replace(_state(a=_active("a", 1000), b=_active("b", 1000), c=_active("c", 1000)), settle_until_ns=1200 * MS)
    assert next_deadline_ns(s, CFG, 1100 * MS) == (1200 * MS + 1, True)


def test_nothing_is_due_before_the_first_epoch_or_after_the_shutdown() -> None:
    assert next_deadline_ns(CoordState(), CFG, 0) == (None, False)
    s = replace(_state(a=_active("a", 0)), shutdown_sent=True)
    assert next_deadline_ns(s, CFG, 0) == (None, False)


class _Shell:
    """The service's state and config, without its sockets: `_wait_s` reads only these."""

    def __init__(self, state: CoordState) -> None:
        self.state, self.mcfg = state, CFG

    wait_s = Coordinator._wait_s


def test_the_service_waits_no_longer_than_the_next_deadline() -> None:
    closed = _Shell(_state(a=_active("a", 900), b=_active("b", 950, closed_ms=1000), c=_active("c", 960)))
    assert closed.wait_s(1290 * MS) == (10 * MS + 1) / 1e9  # the grace runs out before the next poll
    assert closed.wait_s(1010 * MS) == POLL_S  # far ahead: the usual poll
    assert _Shell(CoordState()).wait_s(0) == POLL_S  # no epoch yet: nothing is due on time
