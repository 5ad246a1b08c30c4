"""The receiving half of a WanNode: bounded reads, decoding, identity and fence checks, acks, dedup.

Every received multipart message is taken off the socket within bounds (`_recv_bounded`), decoded,
checked against the identity of its connection and the node's fence, counted, then either an ack
(clears the sender's pending message) or delivered once to its kind's inbox and acked. Anything
rejected is counted and logged as `frame_rejected` with its reason; the node goes on. A reliable
message refused only for its stale epoch is answered with a stale notice (`_send_stale_notice`), and
one of a kind this node has no inbox for with a refusal (`_send_refusal`), so its sender stops
resending what this node will never admit.

`ReceivingMixin` holds methods only: `WanNode` (wan/node.py) owns the state they use.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from wan.delivery import ACKED_KEPT, INCARNATIONS_KEPT, SEQ_WINDOW, SeqWindow
from wan.frames import MAX_BUFFERS, FrameError, Message, check_fence, decode, encode, safe_repr, wire_overhead
from wan.zmq_text import describe_error, peer_text, src_fd

ROUTING_ID_SEP = "#"  # a DEALER's routing id is f"{name}#{random hex}"


# The peer of a CURVE connection whose message carries no ZAP User-Id: not a process name (names match
# ground.messages.NAME), so it is never a member and every message from it is rejected.
NO_USER_ID = "<no User-Id>"

class ReceivingMixin:
    """Receiving and delivery for WanNode (state: _router, _dealer_peer, _queues, _seen, _fence, ...)."""

    def _drain(self, sock: zmq.Socket) -> None:
        for _ in range(256):  # bounded, so timers and sends still run under a flood
            try:
                kept, over, n_frames, n_bytes = self._recv_bounded(sock, router=sock is self._router)
            except zmq.Again:
                return
            try:
                self._on_received(sock, kept, over, n_frames, n_bytes)
            except Exception as e:  # one message must never take the I/O thread down
                self.rejected += 1
                via = peer_text(kept[0]) if sock is self._router else self._dealer_peer.get(sock, "?")
                self.log.emit("frame_rejected", reason="handler_error", detail=describe_error(e), peer=via)

    def _recv_bounded(self, sock: zmq.Socket, *, router: bool) -> tuple[list[zmq.Frame], str | None, int, int]:
        """Take one multipart message off `sock`, keeping at most what a valid message can hold.

        Returns (frames kept, why the message is over the limits or None, frames seen, bytes
        seen). A ROUTER's first frame (the routing id) is kept and not counted. Frames past a
        limit are received and released one by one, so an oversized message never sits whole
        in this process's Python memory (libzmq's own buffering is in the module docstring).
        """
        first = sock.recv(zmq.NOBLOCK, copy=False)
        kept = [first]
        max_frames, limit = MAX_BUFFERS + 1, self.wan.max_frame_bytes
        over: str | None = None
        n_frames, n_bytes = (0, 0) if router else (1, len(first.buffer))
        more = first.more
        while more:
            f = sock.recv(copy=False)  # the rest of a multipart message is already queued: no wait
            more = f.more
            n_frames += 1
            n_bytes += len(f.buffer)
            if over is not None:
                continue  # released at once
            if n_frames > max_frames:
                over = f"too_many_frames: more than {max_frames} frames"
            elif n_bytes > limit:
                over = f"too_large: more than {limit} bytes"
            if over is None:
                kept.append(f)
            else:
                del kept[2 if router else 1:]  # keep the routing id and the first frame (its User-Id)
        return kept, over, n_frames, n_bytes

    def _on_received(self, sock: zmq.Socket, kept: list[zmq.Frame], over: str | None, n_frames: int,
                     n_bytes: int) -> None:
        if sock is self._router:
            rid = kept[0].bytes
            peer = self._router_peer(rid, kept[1] if len(kept) > 1 else None)
            link, direction = self._rx_link(peer, from_router=True)
            parts, via = kept[1:], peer_text(rid)
        else:
            peer = self._dealer_peer[sock]
            link, direction = self._rx_link(peer, from_router=False)
            parts, via = kept, peer
        if over is not None or not parts:
            reason, detail = (over or "empty: no frames after the routing id").split(": ", 1)
            self._reject_raw(reason, detail, via, link, direction, n_bytes, frames=n_frames)
            return
        fd = src_fd(parts[-1]) if sock is self._router else None
        self._on_frames(parts, peer=peer, via=via, link=link, direction=direction,
                        rid=rid if sock is self._router else None, fd=fd)

    def _router_peer(self, rid: bytes, frame: zmq.Frame | None) -> str:
        """The member a ROUTER connection belongs to: its key's User-Id under CURVE, else the name in its id.
        Under CURVE a message without a User-Id belongs to nobody (NO_USER_ID, which names no member, so the
        identity check rejects it): falling back to the routing id would let a connection name itself."""
        if self.wan.curve:
            try:
                user = frame.get("User-Id") if frame is not None else None
            except zmq.ZMQError:
                user = None
            return str(user) if user else NO_USER_ID
        return rid.decode("utf-8", "replace").rsplit(ROUTING_ID_SEP, 1)[0]

    def _rx_link(self, peer: str, from_router: bool) -> tuple[str, str]:
        if from_router:
            link = self.server_links.get(peer)
            if link is None:
                link = f"{peer}_to_{self.name}" if peer in self._fence.members else f"unknown_to_{self.name}"
            return link, "up"
        return self.routes[peer].link, "down"

    def _reject_raw(self, reason: str, detail: str, via: str, link: str, direction: str, size: int,
                    **extra: Any) -> None:
        self.rejected += 1
        self.counters.add("rx", link, direction, "control", size)
        self.log.emit("frame_rejected", reason=reason, detail=detail, peer=via, link=link, bytes=size, **extra)

    def _identity_error(self, msg: Message, peer: str, rid: bytes | None) -> str | None:
        """Why msg may not come from this connection, or None (see the module docstring)."""
        if peer == NO_USER_ID:
            return f"identity_mismatch: a CURVE connection without a User-Id delivered a message from {safe_repr(msg.src)}"
        if rid is None:  # a DEALER: the server proved its key in the handshake
            if msg.src != peer:
                return f"identity_mismatch: the connection to {peer!r} delivered a message from {safe_repr(msg.src)}"
            return None
        claimed = rid.decode("utf-8", "replace").rsplit(ROUTING_ID_SEP, 1)[0]
        if msg.src != peer or claimed != peer:
            who = "key" if self.wan.curve else "routing id"
            return (f"identity_mismatch: {who} of {peer!r}, routing id {safe_repr(peer_text(rid))}, "
                    f"message from {safe_repr(msg.src)}")
        return None

    def _on_frames(self, parts: list[Any], *, peer: str, via: str, link: str, direction: str,
                   rid: bytes | None, fd: int | None = None) -> None:
        try:
            msg = decode(parts, max_frame_bytes=self.wan.max_frame_bytes, max_header_bytes=self.wan.max_header_bytes)
        except FrameError as e:
            self._reject_raw(e.reason, e.detail, via, link, direction, sum(len(p.buffer) for p in parts))
            return
        self.counters.add("rx", link, direction, msg.cls, msg.wire_bytes + wire_overhead(
            [len(p.buffer) for p in parts], self.wan.curve))
        reason = self._identity_error(msg, peer, rid)
        stale = False
        if reason is None:
            fence = self._fence
            ok, why = check_fence(msg, fence)
            reason = None if ok else why
            stale = not ok and why.startswith("stale_epoch") and msg.seq > 0
        if reason is None and msg.kind != "ack" and msg.kind not in self._queues:
            reason = f"unknown_kind: no inbox for kind {safe_repr(msg.kind)}"
        if reason is None and msg.seq > 0 and not self._window(msg).in_window(msg.seq):
            reason = f"seq_window: seq {msg.seq} is more than {SEQ_WINDOW} above {self._window(msg).low}"
        if reason is not None:
            self.rejected += 1
            self.log.emit("frame_rejected", reason=reason.split(":")[0], detail=reason, peer=via, link=link,
                          kind=msg.kind, msg_epoch=msg.epoch, msg_run=msg.run, src=msg.src)
            if stale:
                self._send_stale_notice(peer, msg, fence.epoch)
            elif reason.startswith("unknown_kind") and msg.seq > 0:  # identity and fence passed: for good
                self._send_refusal(peer, msg, "unknown_kind")
            return
        if rid is not None:
            lost_since = self.router_connections.lost_since(msg.src)  # when its previous connection here closed
            self.monitor.heard(msg.src, fd)
            self._learn_peer(msg.src, rid, lost_since)
        if rid is None:
            # Over this node's own client connection to msg.src, whose server key the handshake
            # verified: the process answering there is msg.src's current incarnation. (A message on
            # the ROUTER may come from any holder of msg.src's key: only its acks count, `_on_ack`.)
            self._peer_inc[msg.src] = msg.inc  # one dict store: atomic under the GIL, read by other threads
        if msg.kind == "ack":
            self._on_ack(msg)
            return
        self._deliver(msg, peer)

    def _deliver(self, msg: Message, peer: str) -> None:
        """Ack a reliable message, drop a duplicate, queue the rest in its (bounded) inbox."""
        window = self._window(msg) if msg.seq > 0 else None
        if window is not None and window.is_seen(msg.seq):
            self._send_ack(peer, msg)  # the first ack may have been lost
            self.duplicates += 1
            return
        inbox = self._queues[msg.kind]
        if not inbox.offer(msg):  # not delivered and not acked: a genuine sender resends it later
            self.rejected += 1
            with inbox.mutex:
                which = inbox.full_for(msg) or "inbox"
            self.log.emit("frame_rejected", reason="inbox_full", peer=peer, kind=msg.kind, src=msg.src,
                          detail=f"inbox of {msg.kind!r} holds {inbox.qsize()} messages, {inbox.nbytes} bytes; "
                                 f"full: the {which}")
            return
        if window is not None:
            window.mark(msg.seq)
            self._send_ack(peer, msg)

    def _send_ack(self, peer: str, msg: Message) -> None:
        """Ack over the route to `peer`. Where that is this node's own client route and it is down
        (the peer restarted, or this node has just started and its handshake is not done), the ack
        is held and goes out when the route is up (`_send_held_acks`): dropping it would leave the
        sender to resend a delivered message."""
        ack = encode(kind="ack", cls="control", run=self.run_id, epoch=self.epoch, step=self.step,
                     src=self.name, inc=self.inc, seq=0, body={"seq": msg.seq, "inc": msg.inc})
        if not self._raw_send(peer, ack, "control") and peer in self._dealers:
            self._held_acks[peer].append(ack)

    def _send_held_acks(self, peer: str) -> None:
        held = self._held_acks.get(peer)
        while held:
            if not self._raw_send(peer, held[0], "control"):
                return  # queue full: the rest go with the next reconnect or are re-acked on a resend
            held.popleft()

    def _send_stale_notice(self, peer: str, msg: Message, fence_epoch: int) -> None:
        """Tell the sender of a reliable message refused as stale that this fence stands at `fence_epoch`.

        Not an ack: the message was not delivered and `acked_by` never learns of it. The sender
        drops what it holds for this node below that epoch (`_drop_superseded`) instead of
        resending it for ever. It goes only over a route this node already has to `peer` (a
        ROUTER replies through the routing id that last delivered an accepted message from it:
        a stale message never re-routes replies), so a member whose route is not learned yet
        hears it after its next accepted message, when its resends come again.
        """
        notice = encode(kind="ack", cls="control", run=self.run_id, epoch=self.epoch, step=self.step,
                        src=self.name, inc=self.inc, seq=0,
                        body={"seq": msg.seq, "inc": msg.inc, "stale_fence": fence_epoch})
        self._raw_send(peer, notice, "control")

    def _send_refusal(self, peer: str, msg: Message, why: str) -> None:
        """Tell the sender of a reliable message that this node refuses it for good (`why`): no inbox
        of this incarnation takes its kind (inboxes are registered before the node starts). Not an
        ack; the sender forgets the message instead of resending it every retransmit timeout. Like the
        stale notice, it goes only over a route this node already has to `peer`."""
        notice = encode(kind="ack", cls="control", run=self.run_id, epoch=self.epoch, step=self.step,
                        src=self.name, inc=self.inc, seq=0,
                        body={"seq": msg.seq, "inc": msg.inc, "refused": why, "refused_kind": str(msg.kind)[:64]})
        self._raw_send(peer, notice, "control")

    def _window(self, msg: Message) -> SeqWindow:
        """The sequence window of (msg.src, msg.inc); only the latest INCARNATIONS_KEPT per member are kept."""
        per_src = self._seen[msg.src]
        w = per_src.get(msg.inc)
        if w is None:
            w = per_src[msg.inc] = SeqWindow()
            while len(per_src) > INCARNATIONS_KEPT:
                per_src.popitem(last=False)
        return w

    def _learn_peer(self, peer: str, rid: bytes, lost_since: int | None = None) -> None:
        """Route replies to `peer` through the connection that just proved to be it; resend what
        may have been lost.

        Where this ROUTER is the route to `peer` (a node without a client route to it, e.g. the
        coordinator answering a site), everything unacked goes again over the new connection.
        Where this node has its own client route to `peer`, its messages travel over that route
        (whose reconnect resends what may have died in it, wan/monitor.py) and only the acks come
        back over `peer`'s connection here; `peer` holds acks while its route is down. So only
        messages sent before `peer`'s previous connection here closed (`lost_since`, ns), whose
        acks may have died in it, go again. Resending everything sent every unacked message twice
        after a restarted peer came back: a donor's whole state (7.2 MB in a demo run) crossed the
        WAN twice, the second copy as duplicates.
        """
        old = self._peer_rid.get(peer)
        if old == rid:
            return
        self._peer_rid[peer] = rid
        why = "peer reconnected" if old is not None else "peer connected"
        if peer not in self._dealers:
            self._resend_all(peer, why)
        elif old is not None:
            self._resend_all(peer, why, sent_before_ns=time.monotonic_ns() if lost_since is None else lost_since)

    def _on_ack(self, msg: Message) -> None:
        seq = msg.body.get("seq")
        if msg.body.get("inc") != self.inc or not isinstance(seq, int):
            return  # an ack for a previous incarnation of this process
        # An ack names this incarnation, which only a process that received our messages can know:
        # another holder of the peer's key, on a connection of its own, cannot move this.
        self._peer_inc[msg.src] = msg.inc
        stale_fence = msg.body.get("stale_fence")
        if stale_fence is not None:  # a stale-epoch notice (`_send_stale_notice`), not an ack
            if isinstance(stale_fence, int) and not isinstance(stale_fence, bool):
                self._drop_superseded(msg.src, stale_fence, msg.inc)
            return
        refused = msg.body.get("refused")
        if refused is not None:  # a refusal (`_send_refusal`), not an ack: only msg.src can refuse its own
            with self._lock:
                ch = self._channels.get(msg.src)
                p = ch.refused(seq, time.monotonic_ns()) if ch is not None else None
            if p is not None:
                self.refused_by_peer += 1
                kind, why = msg.body.get("refused_kind"), refused
                self.log.emit("send_refused", dest=msg.src,
                              kind=kind[:64] if isinstance(kind, str) else safe_repr(kind, 64),
                              reason=f"refused by {msg.src}: " + (why[:80] if isinstance(why, str) else safe_repr(why, 80)))
            return
        with self._lock:
            ch = self._channels.get(msg.src)
            p = ch.on_ack(seq, time.monotonic_ns()) if ch is not None else None
            if p is not None:
                acked = self._acked_by[msg.src]
                acked[seq] = msg.inc
                if len(acked) > ACKED_KEPT:
                    acked.popitem(last=False)
