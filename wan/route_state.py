"""The state of a node's own client routes (DEALER, one per peer): whether each is up, and what was
handed to it just before it went down.

A route carries messages only between a successful handshake and the next disconnect. A message
handed to ZeroMQ within DOUBT_WINDOW_NS before its connection was seen to close may have died in the
connection's buffers: its bytes are "in doubt" (counted by the caller as side `doubt`). Pure
bookkeeping on the caller's clock; the node's I/O thread writes, other threads ask `is_down`.
"""

from __future__ import annotations

import collections
import threading

# A message handed to ZeroMQ this long before its connection was seen to close may have died in
# the connection's buffers without reaching the proxy (ns).
DOUBT_WINDOW_NS = 250_000_000


class RouteStates:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ever_up: dict[str, bool] = {}
        self._down: dict[str, bool] = {}
        # per route: (mono ns, traffic class, wire bytes) handed to ZeroMQ within the doubt window
        self._recent: dict[str, collections.deque[tuple[int, str, int]]] = collections.defaultdict(collections.deque)

    def usable(self, peer: str) -> bool:
        """Up: a handshake succeeded and no disconnect came after it."""
        return self._ever_up.get(peer, False) and not self._down.get(peer, False)

    def is_down(self, peer: str) -> bool:
        """Between a disconnect and the next handshake (a route never up is not down)."""
        with self._lock:
            return self._down.get(peer, False)

    def sent(self, peer: str, now_ns: int, cls: str, wire: int) -> None:
        """`wire` bytes of class `cls` were handed to the route at `now_ns`."""
        recent = self._recent[peer]
        recent.append((now_ns, cls, wire))
        while recent and now_ns - recent[0][0] > DOUBT_WINDOW_NS:
            recent.popleft()

    def disconnected(self, peer: str, now_ns: int) -> list[tuple[str, int]]:
        """The route went down: (class, wire bytes) of what it was handed within the doubt window."""
        with self._lock:
            self._down[peer] = True
        recent = self._recent.pop(peer, None) or collections.deque()
        return [(cls, wire) for t, cls, wire in recent if now_ns - t <= DOUBT_WINDOW_NS]

    def handshake(self, peer: str) -> bool:
        """A handshake succeeded: the route is up. True when it is a reconnect (it was up before)."""
        with self._lock:
            reconnect = self._down.get(peer, False) or self._ever_up.get(peer, False)
            self._down[peer] = False
            self._ever_up[peer] = True
        return reconnect
