"""Byte counters per link, direction, traffic class and side.

`side` is "tx" for bytes a process put on a socket and "rx" for bytes it took off one.
`link` is the Toxiproxy proxy the bytes crossed (e.g. `a_to_b`, `a_to_coord`); `direction`
is "up" (client to server, Toxiproxy's "upstream") or "down". Counts are wire estimates:
frame payloads plus the ZMTP/CURVE overhead of each frame (`frames.wire_overhead`), so the
sum over classes can be reconciled with Toxiproxy's own counters; what remains is the
per-connection handshake and ZMTP heartbeats, which the report states as framing overhead.
"""

from __future__ import annotations

import threading
from collections import defaultdict


class ByteCounters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (side, link, direction, cls) -> bytes
        self._bytes: dict[tuple[str, str, str, str], int] = defaultdict(int)
        self._msgs: dict[tuple[str, str, str, str], int] = defaultdict(int)

    def add(self, side: str, link: str, direction: str, cls: str, nbytes: int) -> None:
        key = (side, link, direction, cls)
        with self._lock:
            self._bytes[key] += nbytes
            self._msgs[key] += 1

    def snapshot(self) -> list[dict]:
        """Rows {side, link, direction, cls, bytes, messages}, sorted for stable logs."""
        with self._lock:
            return [
                {"side": s, "link": l, "direction": d, "cls": c, "bytes": b, "messages": self._msgs[(s, l, d, c)]}
                for (s, l, d, c), b in sorted(self._bytes.items())
            ]

    def total(self, side: str, cls: str | None = None) -> int:
        with self._lock:
            return sum(b for (s, _l, _d, c), b in self._bytes.items() if s == side and (cls is None or c == cls))
