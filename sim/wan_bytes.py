"""Modeled WAN byte counters of a simulated run: what each process hands its links, per traffic class.

The emulator's WanNode counts every message it sends and receives per (link, direction, class) and
logs the counters as `wan_counters` events, cumulative per process incarnation, every round and once
more (`final`) on a clean exit (wan/counters.py); analysis' byte ledger reads them. A simulated run
has no sockets, so `WanTally` counts what the simulated processes send, message by message, and
logs the same events, so the ledger, the report's inter-site bytes and the simulator's WAN-bytes claim
work on a simulated run. Every number is `modeled`.

Sizes (wire bytes, as the emulator counts them: header, payload and ZeroMQ/CurveZMQ framing):
  * a payload message (a collective part, a state chunk, a checkpoint chunk) is its payload plus
    `SimModel.frame_overhead_bytes`; a payload of B bytes travels in ceil(B / chunk_bytes) messages;
  * a control message is `control_message_bytes` (a heartbeat `heartbeat_message_bytes`), a telemetry
    message `telemetry_message_bytes`;
  * every reliable message is acked: `ack_bytes`, class control, from the receiver;
  * a checkpoint speaks the store's protocol (checkpoint_store/client.py): per blob its chunks,
    then a `ckpt_finish` answered by `ckpt_blob_ok`, then the manifest answered by `ckpt_durable`;
    a restore asks for the manifest, then each blob chunk by chunk (one `ckpt_blob_get` per chunk,
    answered by the chunk). These requests and replies are `store_message_bytes` each, class
    checkpoint, reliable (so each is acked).
These sizes are `prior` until `xdc sim calibrate` fits them from emulator runs' counters.

Links and directions, as the emulator's topology has them: a site reaches a peer over its own
client link `<site>_to_<peer>` (direction `up`), so a peer's ack returns over the peer's link to it;
the coordinator and the store only serve, so they answer on the site's link `<site>_to_coord` /
`<site>_to_store` in direction `down`, and a site acks them `up`.

Not modeled: resends (after a reconnect or a retransmit timeout), the parts of a collective that a
failure interrupted (a simulated round that is not reduced sends nothing), the store's request and
reply messages around each checkpoint (a few hundred bytes per checkpoint), and the coordinator's
per-site status replies. A killed incarnation logs no final counters (as in the emulator); what it
sent after its last snapshot is in its receivers' `rx` rows, which the ledger uses then.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Sequence

SERVICES = ("coord", "store")


class WanTally:
    """Per process incarnation (process, pid): (side, link, direction, class) -> [bytes, messages]."""

    def __init__(self, chunk_bytes: int, model: Any, pid_of: Callable[[str], int | None]) -> None:
        self.chunk_bytes = max(1, int(chunk_bytes))
        self.m = model
        self.pid_of = pid_of  # the live incarnation's pid of a process, or None (not running)
        self.rows: dict[tuple[str, int], dict[tuple[str, str, str, str], list[int]]] = defaultdict(
            lambda: defaultdict(lambda: [0, 0]))

    # ------------------------------------------------------------------ routing
    @staticmethod
    def route(src: str, dst: str) -> tuple[str, str]:
        """(link, direction) that a message from src to dst travels."""
        if src in SERVICES:
            return f"{dst}_to_{src}", "down"
        return f"{src}_to_{dst}", "up"

    def _count(self, proc: str, pid: int | None, side: str, link: str, direction: str, cls: str, nbytes: int,
               messages: int) -> None:
        if pid is None or messages <= 0:
            return
        row = self.rows[(proc, pid)][(side, link, direction, cls)]
        row[0] += int(nbytes)
        row[1] += int(messages)

    def _send(self, src: str, dst: str, cls: str, nbytes: int, messages: int, reliable: bool) -> None:
        link, direction = self.route(src, dst)
        src_pid, dst_pid = self.pid_of(src), self.pid_of(dst)
        self._count(src, src_pid, "tx", link, direction, cls, nbytes, messages)
        self._count(dst, dst_pid, "rx", link, direction, cls, nbytes, messages)
        if reliable and dst_pid is not None:
            ack_bytes = round(self.m.ack_bytes * messages)
            alink, adir = self.route(dst, src)
            self._count(dst, dst_pid, "tx", alink, adir, "control", ack_bytes, messages)
            self._count(src, src_pid, "rx", alink, adir, "control", ack_bytes, messages)

    # ------------------------------------------------------------------ what the processes send
    def control(self, src: str, dst: str, *, reliable: bool = True, cls: str = "control") -> None:
        # The only unreliable control message is a heartbeat (telemetry has its own class).
        size = (self.m.telemetry_message_bytes if cls == "telemetry" else
                self.m.control_message_bytes if reliable else self.m.heartbeat_message_bytes)
        self._send(src, dst, cls, round(size), 1, reliable)

    def payload(self, src: str, dst: str, cls: str, payload_bytes: int, messages: int | None = None) -> None:
        """`payload_bytes` from src to dst in `messages` reliable messages (default: chunk_bytes each)."""
        n = messages if messages is not None else max(1, math.ceil(payload_bytes / self.chunk_bytes))
        self._send(src, dst, cls, payload_bytes + round(self.m.frame_overhead_bytes * n), n, True)

    def store_message(self, src: str, dst: str, messages: int = 1) -> None:
        """Requests to the checkpoint store or its replies: small, class checkpoint, reliable."""
        self._send(src, dst, "checkpoint", round(self.m.store_message_bytes * messages), messages, True)

    def checkpoint_upload(self, site: str, blobs: Sequence[int]) -> None:
        """One checkpoint: each blob's chunks and its finish (answered), then the manifest (answered)."""
        for size in blobs:
            self.payload(site, "store", "checkpoint", size)
            self.store_message(site, "store")  # ckpt_finish
            self.store_message("store", site)  # ckpt_blob_ok
        self.store_message(site, "store")  # ckpt_manifest
        self.store_message("store", site)  # ckpt_durable

    def checkpoint_read(self, site: str, blobs: Sequence[int]) -> None:
        """One restore: the manifest asked for (answered), then each blob fetched chunk by chunk."""
        self.store_message(site, "store")  # ckpt_frontier_get
        self.store_message("store", site)  # ckpt_frontier
        for size in blobs:
            self.store_message(site, "store", max(1, math.ceil(size / self.chunk_bytes)))  # ckpt_blob_get
            self.payload("store", site, "checkpoint", size)  # ckpt_blob_part

    # ------------------------------------------------------------------ the events
    def snapshot(self, proc: str, pid: int | None) -> list[dict[str, Any]]:
        """Rows {side, link, direction, cls, bytes, messages} of one incarnation, sorted as the emulator's."""
        if pid is None:
            return []
        rows = self.rows.get((proc, pid), {})
        return [{"side": s, "link": l, "direction": d, "cls": c, "bytes": b, "messages": n}
                for (s, l, d, c), (b, n) in sorted(rows.items())]

    def emit(self, log: Any, proc: str, pid: int | None, *, final: bool) -> None:
        log.emit("wan_counters", counters=self.snapshot(proc, pid), rejected=0, duplicates=0, retransmits=0,
                 dropped_while_down=0, final=final, modeled=True)
