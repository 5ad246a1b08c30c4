"""Delivery state of a WanNode: bounded inboxes, per-source sequence windows, pending reliable sends.

A reliable message has a per-destination sequence number. The sender keeps it as `Pending` until it
is acked; the receiver de-duplicates by (source, incarnation, seq) in a `SeqWindow` and queues what it
delivers in a bounded `Inbox`. The limits here bound what an insider can make a node hold
(see wan/node.py's docstring).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

from wan.frames import Message

INBOX_MAX_MESSAGES = 65_536  # per inbox; more is rejected as inbox_full (not acked: the sender resends)
INBOX_MAX_BYTES = 256 * 1024 * 1024  # per inbox, wire bytes of the messages it holds
SEQ_WINDOW = 65_536  # a reliable seq may be at most this far above its window's low mark
INCARNATIONS_KEPT = 8  # sequence windows kept per member (its latest incarnations)
ACKED_KEPT = 4096  # per destination: which peer incarnation acked each of the latest reliable messages
HELD_ACKS_MAX = 4096  # per peer: acks held while this node's own route to it is down (oldest dropped)


@dataclass
class Pending:
    frames: list[Any]
    cls: str
    wire: int
    first_sent_ns: int
    last_sent_ns: int
    handed: bool = False  # handed to ZeroMQ at least once (a later send is a resend)
    epoch: int | None = None  # the epoch the receiver's fence checks; None for an unfenced kind


class Inbox(queue.Queue):
    """A queue of delivered messages bounded in count and in wire bytes; `offer` never blocks."""

    def __init__(self, max_messages: int = INBOX_MAX_MESSAGES, max_bytes: int = INBOX_MAX_BYTES) -> None:
        super().__init__()
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.nbytes = 0

    def offer(self, msg: Message) -> bool:
        """Queue msg unless the inbox is full (then False)."""
        with self.not_full:
            if self._qsize() >= self.max_messages or self.nbytes + msg.wire_bytes > self.max_bytes:
                return False
            self._put(msg)
            self.unfinished_tasks += 1
            self.not_empty.notify()
            return True

    def _put(self, item: Message) -> None:
        self.nbytes += item.wire_bytes
        super()._put(item)

    def _get(self) -> Message:
        item = super()._get()
        self.nbytes -= item.wire_bytes
        return item


class SeqWindow:
    """Seen sequence numbers of one (source, incarnation): a low-water mark plus a sparse set.

    `above` never holds more than SEQ_WINDOW numbers: the node rejects a seq outside the window
    (`in_window`) before asking `seen_before`.
    """

    def __init__(self) -> None:
        self.low = 0  # every seq <= low has been seen
        self.above: set[int] = set()

    def in_window(self, seq: int) -> bool:
        return seq <= self.low + SEQ_WINDOW

    def is_seen(self, seq: int) -> bool:
        return seq <= self.low or seq in self.above

    def mark(self, seq: int) -> None:
        if self.is_seen(seq):
            return
        self.above.add(seq)
        while self.low + 1 in self.above:
            self.low += 1
            self.above.discard(self.low)

    def seen_before(self, seq: int) -> bool:
        """True if seq was seen; else mark it seen and return False."""
        if self.is_seen(seq):
            return True
        self.mark(seq)
        return False

