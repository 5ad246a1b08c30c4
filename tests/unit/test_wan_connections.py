"""A ROUTER's connections (wan/connections.py) on a virtual clock: a member is lost when its newest
connection closes, not an older one, and heard again on any later message."""

from __future__ import annotations

from wan.connections import RouterConnections


def test_a_member_is_lost_when_its_newest_connection_closes_and_found_when_heard_again():
    rc = RouterConnections()
    assert rc.heard("a", 7, 1_000) is None  # first contact over connection 7
    assert rc.heard("a", 9, 2_000) is None  # a reconnect: connection 9 is a's newest
    assert rc.closed(7) is None and rc.lost() == {}  # the old connection closing says nothing
    assert rc.closed(9) == "a"
    rc.mark_lost("a", 5_000_000)
    assert rc.lost() == {"a": 5_000_000} and rc.lost_since("a") == 5_000_000
    assert rc.heard("a", 11, 17_500_000) == 12.5  # unheard for 12.5 ms, connected again
    assert rc.lost() == {} and rc.lost_since("a") is None
    assert rc.closed(9) is None  # a closed connection closes once


def test_a_message_not_over_the_router_only_ends_a_loss():
    rc = RouterConnections()
    rc.heard("b", 3, 0)
    assert rc.closed(3) == "b"
    rc.mark_lost("b", 0)
    assert rc.heard("b", None, 1_000_000) == 1.0 and rc.lost() == {}
    assert rc.closed(3) is None  # the mapping stayed gone: b has no ROUTER connection now
