"""The sending half of a WanNode: per-link hand-off to ZeroMQ, byte counting and resends.

A message is handed to ZeroMQ only over a route that is up (`_route_up`); every send is counted per
link/direction/class, and what a DEALER route was handed recently is kept so that a disconnect can
count the bytes that may have died in the connection (wan/route_state.py). Unacked reliable messages
are resent after a reconnect or after `retransmit_timeout_ms` without ack progress.

`SendingMixin` holds methods only: `WanNode` (wan/node.py) owns the state they use.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from wan.zmq_text import wire_size


class SendingMixin:
    """Sending, counting and resending for WanNode (state: routes, _dealers, _router, _channels, ...)."""

    def _link_of(self, dest: str) -> tuple[str, str, str]:
        """(side, link, direction) of traffic sent to dest."""
        if dest in self._dealers:
            return "tx", self.routes[dest].link, "up"
        return "tx", self.server_links.get(dest, f"{dest}_to_{self.name}"), "down"

    def _route_up(self, dest: str) -> bool:
        """A client route carries messages only between a handshake and the next disconnect.

        Handing ZeroMQ a message for a route that is down would queue it in a pipe that may never
        reach the proxy (the peer may be gone for good), yet it would be counted as sent. So such a
        message is not handed over: a reliable one waits among the unacked and goes out when the
        handshake succeeds; an unreliable one is dropped and tallied (`dropped_while_down`).
        """
        return dest not in self._dealers or self.route_states.usable(dest)

    def _raw_send(self, dest: str, frames: list[Any], cls: str) -> bool:
        if not self._route_up(dest):
            return False
        try:
            if dest in self._dealers:
                self._dealers[dest].send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            elif self._router is not None:
                rid = self._peer_rid.get(dest)
                if rid is None:
                    return False  # not heard from yet: a reliable message waits until it is (`_learn_peer`)
                self._router.send_multipart([rid, *frames], flags=zmq.NOBLOCK, copy=False)
            else:
                raise KeyError(dest)
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return False  # peer not connected now; a reliable message stays unacked and is resent
            raise
        except KeyError:
            self.log.emit("send_failed", dest=dest, reason="no route to this process")
            return True
        side, link, direction = self._link_of(dest)
        wire = wire_size(frames, self.wan.curve)
        self.counters.add(side, link, direction, cls, wire)
        if dest in self._dealers:
            self.route_states.sent(dest, time.monotonic_ns(), cls, wire)
        return True

    def _flush_outbox(self) -> None:
        while True:
            with self._lock:
                if not self._outbox:
                    return
                dest, frames, cls, reliable, seq, fenced_epoch = self._outbox.popleft()
                if reliable:
                    self._channels[dest].track(seq, frames, cls, wire_size(frames, self.wan.curve), time.monotonic_ns(),
                                               fenced_epoch)
            if dest in self._dealers and not self._route_up(dest):
                if not reliable:
                    self.dropped_while_down += 1
                continue  # a reliable message waits in its channel (wan/reliable.py) for the handshake
            sent = self._raw_send(dest, frames, cls)
            if sent and reliable:
                with self._lock:
                    self._channels[dest].handed_over(seq)
            if not sent and not reliable:
                self.log.emit("send_dropped", dest=dest, kind_cls=cls, reason="peer unreachable or queue full")
            if not sent and dest in self._dealers:
                # Queue full: try again on the next loop rather than spin.
                if not reliable:
                    continue
                return

    def _resend_all(self, dest: str, why: str, sent_before_ns: int | None = None) -> None:
        """Send every unacked message to `dest` again (or, with `sent_before_ns`, only those last
        handed to ZeroMQ before that time); a parked one goes for the first time."""
        with self._lock:
            ch = self._channels.get(dest)
            pend = ch.to_resend(sent_before_ns) if ch is not None else []
        if ch is None or not pend:
            return
        now = time.monotonic_ns()
        nbytes = resent = first = 0
        for p in pend:
            if self._raw_send(dest, p.frames, p.cls):
                with self._lock:
                    again = ch.resent(p, now)
                if again:
                    nbytes += p.wire
                    resent += 1
                else:
                    first += 1  # parked while the route was down: its first send, not a resend
        with self._lock:
            ch.restart_clock(now)
        self.retransmits += resent
        if resent:
            self.log.emit("retransmit", dest=dest, messages=resent, wire_bytes=nbytes, reason=why)
        if first:
            self.log.emit("parked_sent", dest=dest, messages=first, reason=why)

    def _drop_superseded(self, dest: str, fence_epoch: int, peer_inc: int) -> None:
        """Forget the unacked messages to `dest` that its fence now refuses for ever.

        `dest` said (in a stale-epoch notice, wan/receiver.py) that its fence stands at
        `fence_epoch`. A fence only rises, so every pending message of a fenced kind and an earlier
        epoch would be refused at every resend: without this, the sender resent them every
        retransmit timeout for the rest of the run, and after a long collapse the current epoch's
        messages queued behind tens of megabytes of superseded ones (a livelock). Only `dest`
        can say this about its own fence (the notice passed the identity checks), so a key holder
        can at most give up messages addressed to itself. Messages of an unfenced kind, or of an
        epoch the fence still admits, stay and are resent as before: a peer that is still in an
        earlier epoch is never starved.
        """
        with self._lock:
            ch = self._channels.get(dest)
            if ch is None:
                return
            gone, nbytes = ch.drop_superseded(fence_epoch, time.monotonic_ns())
        if gone:
            self.superseded += gone
            self.log.emit("superseded_dropped", dest=dest, messages=gone, wire_bytes=nbytes,
                          fence_epoch=fence_epoch, peer_inc=peer_inc)

    def _check_retransmit(self) -> None:
        """Resend what is unacked to a destination when no ack has come from it for the timeout, or
        when its oldest unacked message has waited the timeout although a message sent after it was
        acked. Messages to one destination travel one connection in order and are acked in order, so
        the second means it (or its ack) was lost. Without it, a steady flow of acks for newer messages
        (a store client's probes and their replies) kept a lost one from ever being resent."""
        now = time.monotonic_ns()
        timeout_ns = self.wan.retransmit_timeout_ms * 1_000_000
        with self._lock:
            due = [(d, why) for d, ch in self._channels.items() if (why := ch.due(now, timeout_ns)) is not None]
        for d, why in due:
            self._resend_all(d, why)
