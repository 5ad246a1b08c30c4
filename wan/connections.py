"""A ROUTER's connections, for the coordinator's failure detection: which member each connection
(file descriptor, ZMQ_SRCFD) last authenticated as, each member's newest connection, and the members
whose newest connection closed and who have sent nothing since (with the mono ns it closed at).

Pure bookkeeping on the caller's clock, safe across threads (the I/O thread writes, the
coordinator's thread reads `lost`); the node logs what these calls return (wan/monitor.py).
TCP delivers everything sent on a connection before its close, so a message after a close came over
a new connection: the member is connected again.
"""

from __future__ import annotations

import threading


class RouterConnections:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd_peer: dict[int, str] = {}
        self._peer_fd: dict[str, int] = {}
        self._lost: dict[str, int] = {}

    def heard(self, peer: str, fd: int | None, now_ns: int) -> float | None:
        """An authenticated message from `peer` arrived on connection `fd` (None: not over the ROUTER).
        Returns how long (ms) the peer had been unheard since its newest connection closed, if it had."""
        with self._lock:
            if fd is not None and self._peer_fd.get(peer) != fd:
                old = self._peer_fd.get(peer)
                if old is not None and self._fd_peer.get(old) == peer:
                    del self._fd_peer[old]
                self._fd_peer[fd] = peer
                self._peer_fd[peer] = fd
            since = self._lost.pop(peer, None)
        return None if since is None else round((now_ns - since) / 1e6, 1)

    def closed(self, fd: int) -> str | None:
        """Connection `fd` closed: the member whose newest connection it was, else None. The caller
        logs it, then marks the member `lost` (the log comes before anyone can act on it; one thread,
        the node's I/O thread, calls `heard`, `closed` and `mark_lost`)."""
        with self._lock:
            peer = self._fd_peer.pop(fd, None)
            if peer is None or self._peer_fd.get(peer) != fd:
                return None
            del self._peer_fd[peer]
            return peer

    def mark_lost(self, peer: str, now_ns: int) -> None:
        with self._lock:
            self._lost[peer] = now_ns

    def lost_since(self, peer: str) -> int | None:
        """When `peer`'s newest connection closed, if it did and nothing came from it since."""
        with self._lock:
            return self._lost.get(peer)

    def lost(self) -> dict[str, int]:
        """Every lost member with the mono ns its newest connection closed at."""
        with self._lock:
            return dict(self._lost)
