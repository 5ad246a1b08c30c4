"""Reliable delivery to one peer, as a pure state machine: what a node owes one destination.

A `ReliableChannel` numbers the reliable messages to its destination, keeps each as `Pending` until
the destination acks it, forgets what the destination's fence refuses for ever (a stale-epoch
notice), and says when its unacked messages are due for a resend. It does no I/O and reads no
clock: every call that depends on time takes `now_ns` (monotonic ns), so it is tested on a virtual
clock (tests/unit/test_reliable_channel.py). The node (wan/node.py) owns one per destination and its
lock; its sending half (wan/sender.py) hands what the channel says to ZeroMQ.

Resend rule: messages to one destination travel one connection in order and are acked in order.
So they are due when no ack has come for the timeout while something is outstanding, or when the
oldest outstanding one has waited the timeout although a message sent after it was acked (it, or
its ack, was lost: a steady flow of newer acks must not hide it).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any


@dataclass
class Pending:
    """One reliable message not acked yet."""

    frames: list[Any]
    cls: str
    wire: int  # bytes on the wire (ns clock values are monotonic ns)
    first_sent_ns: int
    last_sent_ns: int
    handed: bool = False  # handed to ZeroMQ at least once (a later send is a resend)
    epoch: int | None = None  # the epoch the receiver's fence checks; None for an unfenced kind


class ReliableChannel:
    """Sequence numbers, the unacked and the resend clock for one destination. Not thread-safe: the
    owner holds its own lock around every call."""

    def __init__(self) -> None:
        self.last_seq = 0  # the last sequence number given out (the first message is 1)
        self.pending: collections.OrderedDict[int, Pending] = collections.OrderedDict()  # by seq, oldest first
        self.progress_ns = 0  # the last ack (or resend, or drop) that restarted the no-progress clock
        self.acked_sent_ns = 0  # the latest send time of a message the destination acked
        self.held_bytes = 0  # wire bytes of the outstanding messages (kept as they come and go)

    # ---- sending ------------------------------------------------------------------------------
    def peek_seq(self) -> int:
        """The number `next_seq` gives out next (a message not yet known to be sendable is numbered
        with it, and takes it only once it is queued)."""
        return self.last_seq + 1

    def next_seq(self) -> int:
        """The sequence number of the next reliable message (given out when it is queued)."""
        self.last_seq += 1
        return self.last_seq

    def track(self, seq: int, frames: list[Any], cls: str, wire: int, now_ns: int, epoch: int | None) -> Pending:
        """Keep message `seq` until it is acked; the no-progress clock starts when something is outstanding."""
        if not self.pending:
            self.progress_ns = now_ns
        p = self.pending[seq] = Pending(frames, cls, wire, now_ns, now_ns, epoch=epoch)
        self.held_bytes += wire
        return p

    def handed_over(self, seq: int) -> None:
        """Message `seq` was handed to ZeroMQ (a later send of it is a resend)."""
        p = self.pending.get(seq)
        if p is not None:
            p.handed = True

    # ---- what comes back ----------------------------------------------------------------------
    def on_ack(self, seq: int, now_ns: int) -> Pending | None:
        """The destination acked `seq`: forget it; None when it was not outstanding (a duplicate ack)."""
        p = self.pending.pop(seq, None)
        if p is not None:
            self.held_bytes -= p.wire
            self.progress_ns = now_ns
            self.acked_sent_ns = max(self.acked_sent_ns, p.last_sent_ns)
        return p

    def refused(self, seq: int, now_ns: int) -> Pending | None:
        """The destination refused `seq` for good (it has no inbox for its kind): forget it, not acked.
        None when it was not outstanding."""
        p = self.pending.pop(seq, None)
        if p is not None:
            self.held_bytes -= p.wire
            self.progress_ns = now_ns  # what is left gets a fresh timeout
        return p

    def drop_superseded(self, fence_epoch: int, now_ns: int) -> tuple[int, int]:
        """The destination's fence stands at `fence_epoch` (it only rises): forget every outstanding
        message of a fenced kind from an earlier epoch, which it would refuse at every resend. Returns
        (messages, wire bytes) forgotten. Unfenced messages and those of an admitted epoch stay."""
        gone = [seq for seq, p in self.pending.items() if p.epoch is not None and p.epoch < fence_epoch]
        nbytes = sum(self.pending.pop(seq).wire for seq in gone)
        self.held_bytes -= nbytes
        if gone:
            self.progress_ns = now_ns  # progress: what is left gets a fresh timeout
        return len(gone), nbytes

    # ---- resending ----------------------------------------------------------------------------
    def due(self, now_ns: int, timeout_ns: int) -> str | None:
        """Why the outstanding messages are due for a resend now, or None."""
        if not self.pending:
            return None
        ms = timeout_ns // 1_000_000
        if now_ns - self.progress_ns > timeout_ns:
            return f"no ack progress for {ms} ms"
        oldest = next(iter(self.pending.values())).last_sent_ns  # the lowest seq outstanding
        if now_ns - oldest > timeout_ns and oldest < self.acked_sent_ns:
            return f"unacked for {ms} ms while a message sent after it was acked"
        return None

    def to_resend(self, sent_before_ns: int | None = None) -> list[Pending]:
        """The outstanding messages to send again, oldest first (with `sent_before_ns`, only those
        last handed to ZeroMQ before that time); a parked one (never handed) goes for the first time."""
        return [p for p in self.pending.values()
                if sent_before_ns is None or (p.handed and p.last_sent_ns <= sent_before_ns)]

    def resent(self, p: Pending, now_ns: int) -> bool:
        """`p` was handed to ZeroMQ again at `now_ns`: True when it had been handed before (a resend),
        False when this was its first send (it was parked while the route was down)."""
        was = p.handed
        p.last_sent_ns = now_ns
        p.handed = True
        return was

    def restart_clock(self, now_ns: int) -> None:
        """A resend round went out: the no-progress clock starts again."""
        self.progress_ns = now_ns

    # ---- what it holds ------------------------------------------------------------------------
    def outstanding(self) -> int:
        return len(self.pending)

    def outstanding_bytes(self) -> int:
        return self.held_bytes

    def over(self, max_messages: int, max_bytes: int) -> str | None:
        """Why this destination may be sent no new reliable message now (it holds too much unacked), or None."""
        if len(self.pending) >= max_messages:
            return f"{len(self.pending)} unacked messages (at most {max_messages})"
        if self.held_bytes >= max_bytes:
            return f"{self.held_bytes:,} unacked bytes (at most {max_bytes:,})"
        return None

    def parked(self) -> int:
        """Taken off the outbox but never handed to ZeroMQ (the route was down)."""
        return sum(1 for p in self.pending.values() if not p.handed)

    def in_flight(self) -> int:
        """Handed to ZeroMQ and not acked yet."""
        return sum(1 for p in self.pending.values() if p.handed)
