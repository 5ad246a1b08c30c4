"""Connection events of a WanNode: socket monitors, link up/down, and lost ROUTER connections.

A DEALER route is down between a disconnect and the next successful handshake (what it was handed
just before the disconnect is counted as in doubt); a reconnect resends what is unacked and runs the
periodic tasks (heartbeats) at once. On the ROUTER side each connection is tied to the member that
last authenticated on it, so the coordinator's failure detection can ask which members' newest
connection closed (`WanNode.lost_connections`). Failed handshakes are logged.

`ConnectionMonitor` is an object the node owns (wan/node.py), handed the node's pieces it acts on.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import zmq
from zmq.utils.monitor import recv_monitor_message

from wan.connections import RouterConnections
from wan.periodic import Periodic
from wan.route_state import RouteStates


_EVENT_NAMES = {getattr(zmq, n): n[len("EVENT_"):].lower() for n in dir(zmq) if n.startswith("EVENT_")
                and n not in ("EVENT_ALL", "EVENT_ALL_V1", "EVENT_ALL_V2")}
# The value of a HANDSHAKE_FAILED_PROTOCOL event (e.g. "zmtp_mechanism_mismatch": a peer without CURVE).
_PROTOCOL_ERRORS = {getattr(zmq, n): n[len("PROTOCOL_ERROR_"):].lower() for n in dir(zmq)
                    if n.startswith("PROTOCOL_ERROR_")}


class ConnectionMonitor:
    """A node's socket monitors and what their events mean. It owns the monitor sockets; the routes'
    state (wan/route_state.py), the ROUTER's connections (wan/connections.py), the periodic tasks and
    the byte counters are the node's objects it is handed. What a route coming up means for
    delivery (held acks, resends) and the count of refused handshakes stay the node's, through
    `on_route_up(peer, reconnect)` and `on_handshake_refused()`."""

    def __init__(self, *, name: str, log: Any, counters: Any, routes: Mapping[str, Any], server_links: Mapping[str, str],
                 route_states: RouteStates, router_connections: RouterConnections, periodic: Periodic,
                 on_route_up: Callable[[str, bool], None], on_handshake_refused: Callable[[], None]) -> None:
        self.name, self.log, self.counters, self.routes, self.server_links = name, log, counters, routes, server_links
        self.route_states, self.router_connections, self.periodic = route_states, router_connections, periodic
        self.on_route_up, self.on_handshake_refused = on_route_up, on_handshake_refused
        self.sockets: dict[zmq.Socket, str] = {}  # monitor socket -> "server" (the ROUTER) or a route's peer

    def watch(self, sock: zmq.Socket, peer: str) -> None:
        """Monitor `sock`: the ROUTER (peer "server") or the DEALER route to `peer`."""
        self.sockets[sock.get_monitor_socket()] = peer

    def close(self) -> None:
        for s in list(self.sockets):
            s.close(0)

    def on_events(self, msock: zmq.Socket) -> None:
        """Every event waiting on monitor socket `msock`."""
        peer = self.sockets[msock]
        while True:
            try:
                ev = recv_monitor_message(msock, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            name = _EVENT_NAMES.get(ev["event"], str(ev["event"]))
            endpoint = ev.get("endpoint", b"")
            endpoint = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
            if peer == "server":
                if name == "disconnected":
                    self._router_closed(int(ev["value"]))
                    continue
                if name.startswith("handshake_failed"):
                    self.on_handshake_refused()
                    what = _PROTOCOL_ERRORS.get(ev["value"], "") if name == "handshake_failed_protocol" else ""
                    self.log.emit("frame_rejected", reason=name, code=ev["value"], peer=endpoint, link="server",
                                  detail=f"ZMTP/CURVE handshake failed (code {ev['value']}{', ' + what if what else ''})")
                continue
            if name == "disconnected":
                doubt = self._in_doubt(peer, time.monotonic_ns())
                self.log.emit("link_down", peer=peer, link=self.routes[peer].link, in_doubt_bytes=doubt)
            elif name == "handshake_succeeded":
                reconnect = self.route_states.handshake(peer)
                if reconnect:
                    self.log.emit("link_up", peer=peer, link=self.routes[peer].link, reconnect=True)
                    self.periodic.run_all_next()  # heartbeats go out at once: the peer hears we are alive
                self.on_route_up(peer, reconnect)
            elif name.startswith("handshake_failed"):
                self.log.emit("handshake_failed", peer=peer, link=self.routes[peer].link, zmq_event=name, code=ev["value"])

    def heard(self, peer: str, fd: int | None) -> None:
        """An authenticated message from `peer` arrived on connection `fd`: it is connected."""
        silent_ms = self.router_connections.heard(peer, fd, time.monotonic_ns())
        if silent_ms is not None:  # how long a live peer was unheard after its connection closed
            self.log.emit("peer_reconnected", peer=peer, silent_ms=silent_ms)

    def _router_closed(self, fd: int) -> None:
        """A ROUTER connection closed. If it was a member's newest one, that member is lost until
        it is heard again (wan/connections.py)."""
        peer = self.router_connections.closed(fd)
        if peer is not None:
            now = time.monotonic_ns()
            self.log.emit("peer_disconnected", peer=peer, link=self.server_links.get(peer, f"{peer}_to_{self.name}"),
                          fd=fd)  # logged before anyone can act on it
            self.router_connections.mark_lost(peer, now)

    def _in_doubt(self, peer: str, now_ns: int) -> int:
        """The route went down. Bytes handed to it within the doubt window before it closed: counted
        as sent, but they may have died in the connection's buffers. Recorded as side `doubt` (no class
        owns them; the reconciliation allows at most these bytes of excess on the link)."""
        link = self.routes[peer].link
        total = 0
        for cls, wire in self.route_states.disconnected(peer, now_ns):
            self.counters.add("doubt", link, "up", cls, wire)
            total += wire
        return total
