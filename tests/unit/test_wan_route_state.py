"""A client route's state (wan/route_state.py) on a virtual clock: up only between a handshake and
the next disconnect, and on a disconnect the bytes handed to it within the doubt window."""

from __future__ import annotations

from wan.route_state import DOUBT_WINDOW_NS, RouteStates


def test_a_route_is_usable_between_a_handshake_and_a_disconnect_and_a_second_handshake_is_a_reconnect():
    rs = RouteStates()
    assert not rs.usable("b") and not rs.is_down("b")  # never up: not usable, not "down" either
    assert rs.handshake("b") is False and rs.usable("b")
    rs.disconnected("b", 0)
    assert rs.is_down("b") and not rs.usable("b")
    assert rs.handshake("b") is True and rs.usable("b") and not rs.is_down("b")


def test_a_disconnect_puts_in_doubt_only_what_was_handed_within_the_window():
    rs = RouteStates()
    rs.handshake("c")
    rs.sent("c", 0, "collective", 1000)
    rs.sent("c", 100_000_000, "control", 50)
    rs.sent("c", DOUBT_WINDOW_NS + 50_000_000, "collective", 2000)  # the first send leaves the window
    assert rs.disconnected("c", DOUBT_WINDOW_NS + 60_000_000) == [("control", 50), ("collective", 2000)]
    assert rs.disconnected("c", DOUBT_WINDOW_NS + 70_000_000) == []  # counted once
