"""Delivery state of a WanNode: bounded inboxes, per-source sequence windows, pending reliable sends.

A reliable message has a per-destination sequence number. The sender keeps it until it is acked
(wan/reliable.py); the receiver de-duplicates by (source, incarnation, seq) in a `SeqWindow` and queues what it
delivers in a bounded `Inbox`. The limits here bound what an insider can make a node hold
(see wan/node.py's docstring).
"""

from __future__ import annotations

import collections
import queue

from wan.frames import Message

INBOX_MAX_MESSAGES = 65_536  # per inbox; more is rejected as inbox_full (not acked: the sender resends)
INBOX_MAX_BYTES = 256 * 1024 * 1024  # per inbox, wire bytes of the messages it holds
SOURCE_SHARE_MESSAGES = 4  # one source holds at most 1/4 of an inbox's messages ...
SOURCE_SHARE_BYTES = 2  # ... and 1/2 of its bytes (a state transfer's chunks come from one donor)
SEQ_WINDOW = 65_536  # a reliable seq may be at most this far above its window's low mark
INCARNATIONS_KEPT = 8  # sequence windows kept per member (its latest incarnations)
ACKED_KEPT = 4096  # per destination: which peer incarnation acked each of the latest reliable messages
HELD_ACKS_MAX = 4096  # per peer: acks held while this node's own route to it is down (oldest dropped)


class Inbox(queue.Queue):
    """A queue of delivered messages bounded in count and in wire bytes, fair across sources.

    `offer` never blocks. Each source has its own FIFO and may hold at most a share of the inbox
    (`SOURCE_SHARE_MESSAGES`, `SOURCE_SHARE_BYTES`), and `get` takes from the sources in turn, so a
    member that floods (an insider, or a fault) fills its own share and waits its turn: another
    member's heartbeat is neither dropped as `inbox_full` nor queued behind the flood.
    """

    def __init__(self, max_messages: int = INBOX_MAX_MESSAGES, max_bytes: int = INBOX_MAX_BYTES) -> None:
        super().__init__()
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.source_max_messages = max(1, max_messages // SOURCE_SHARE_MESSAGES)
        self.source_max_bytes = max(1, max_bytes // SOURCE_SHARE_BYTES)
        self.nbytes = 0

    # queue.Queue's storage hooks (called with its lock held): per-source FIFOs served in turn.
    def _init(self, maxsize: int) -> None:
        self._by_src: dict[str, collections.deque[Message]] = {}
        self._src_bytes: dict[str, int] = {}
        self._turn: collections.deque[str] = collections.deque()  # sources with queued messages, next first
        self._count = 0

    def _qsize(self) -> int:
        return self._count

    def full_for(self, msg: Message) -> str | None:
        """Why msg would not fit (the inbox's or its source's limit), or None. Call with the lock held."""
        if self._count >= self.max_messages or self.nbytes + msg.wire_bytes > self.max_bytes:
            return "inbox"
        held = self._by_src.get(msg.src)
        if held is not None and (len(held) >= self.source_max_messages
                                 or self._src_bytes[msg.src] + msg.wire_bytes > self.source_max_bytes):
            return f"source {msg.src}'s share"
        return None

    def offer(self, msg: Message) -> bool:
        """Queue msg unless the inbox, or its source's share of it, is full (then False)."""
        with self.not_full:
            if self.full_for(msg) is not None:
                return False
            self._put(msg)
            self.unfinished_tasks += 1
            self.not_empty.notify()
            return True

    def _put(self, item: Message) -> None:
        held = self._by_src.get(item.src)
        if held is None:
            held = self._by_src[item.src] = collections.deque()
            self._src_bytes[item.src] = 0
            self._turn.append(item.src)
        held.append(item)
        self._src_bytes[item.src] += item.wire_bytes
        self._count += 1
        self.nbytes += item.wire_bytes

    def _get(self) -> Message:
        src = self._turn.popleft()
        held = self._by_src[src]
        item = held.popleft()
        self._src_bytes[src] -= item.wire_bytes
        if held:
            self._turn.append(src)  # its next message after every other source's
        else:
            del self._by_src[src], self._src_bytes[src]
        self._count -= 1
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

