"""A process's WAN endpoint: the only place that touches ZeroMQ sockets.

One `WanNode` per process owns, on one I/O thread:
  * an optional ROUTER server socket (bound on the process's own port; peers reach it
    only through their Toxiproxy proxy),
  * one DEALER client socket per route (connected to the proxy of that directed link),
  * a socket monitor per socket (handshake failures, disconnects, reconnects).

Other threads call `send()` (thread-safe) and read delivered messages from queues
(`inbox(kind)`). Delivery that matters is reliable on top of ZeroMQ, which drops queued
and half-sent messages across reconnects: each reliable message has a per-destination
sequence number, the receiver acks it and de-duplicates by (source, incarnation, seq), and
the sender resends what is unacked after a reconnect or after `retransmit_timeout_ms`
without ack progress on that destination.

Every received frame is decoded (`frames.decode`) and fenced (`frames.check_fence`) before
it is delivered; a rejected frame is logged with its reason and dropped, and the node keeps
running. Every frame sent or received is counted per link/direction/class (`counters`).

An insider (a holder of one cluster key) can neither crash, wedge nor impersonate:
  * Any exception while handling one inbound message is caught, counted in `rejected` and
    logged as `frame_rejected` (reason `handler_error`); the loop goes on. If the I/O thread
    dies anyway (a bug), it logs `wan_thread_crashed` and ends the whole process with exit
    code `WAN_CRASH_EXIT_CODE` (70, EX_SOFTWARE): a process whose endpoint is dead must never
    exit 0.
  * Nothing grows without bound: a message of a kind no `inbox()` registered is rejected
    (`unknown_kind`); an inbox holds at most `INBOX_MAX_MESSAGES` messages and
    `INBOX_MAX_BYTES` bytes (`inbox_full`, not acked, so a genuine sender resends later);
    sequence windows accept numbers at most `SEQ_WINDOW` above their low mark and are kept
    for the last `INCARNATIONS_KEPT` incarnations of each member.
  * Identity is bound to the key. The ZAP handler (`keys.ClusterAuthenticator`) admits only
    the cluster's public keys and gives each connection the User-Id of its key's owner. Every
    message a ROUTER receives must carry `src` == that User-Id == the name in its routing
    id; the ROUTER sends to a member only through the routing id that last delivered an
    authenticated message from it. Each DEALER announces a fresh random routing id
    (`name#<64 random bits>`, encrypted inside the CURVE handshake), so ROUTER_HANDOVER lets
    a reconnecting socket take over its own stale connection, but no other key holder can
    guess an id to take over. (ZAP cannot refuse a routing id at the handshake: libzmq's ZAP
    request carries the *server* socket's own routing id, not the client's, so the binding is
    enforced per message.) A DEALER accepts only messages whose `src` is the peer whose
    server key it verified.
  * A whole multipart message is bounded while it is taken off the socket
    (`_recv_bounded`): at most `frames.MAX_BUFFERS + 1` frames and `max_frame_bytes` bytes;
    the rest of an oversized message is read and dropped frame by frame. What libzmq itself
    still buffers before the application sees anything: ZMQ_MAXMSGSIZE bounds each frame
    (a larger one drops the connection), but libzmq has no limit on the number of frames of
    one message, and it queues a multipart message only once it is complete; RCVHWM counts
    whole messages per peer and is checked only between messages. So a key holder can make
    libzmq hold one message of many maximal frames (and up to RCVHWM messages per
    connection) in memory; only the kernel's socket buffers and these HWMs bound it. Without
    CURVE (`wan.curve: false`) nobody is authenticated and all of this is open to anyone
    on the network.

The node's pieces: delivery state (inboxes, sequence windows, pending sends) in `wan.delivery`,
sending and resending in `wan.sender`, receiving and acking in `wan.receiver`, socket monitor
events and connection tracking in `wan.monitor`, the sockets made and configured in `wan.sockets`;
this module owns them and the I/O loop.
"""

from __future__ import annotations

import collections
import os
import random
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np
import zmq

from wan import keys as keymod
from wan import sockets
from wan.connections import RouterConnections
from wan.counters import ByteCounters
from wan.periodic import Periodic
from wan.route_state import RouteStates
from wan.delivery import HELD_ACKS_MAX, INBOX_MAX_BYTES, INBOX_MAX_MESSAGES, Inbox, SeqWindow
from wan.reliable import ReliableChannel
from wan.frames import UNFENCED_KINDS, Fence, encode, undeliverable
from wan.monitor import ConnectionMonitor
from wan.receiver import ReceivingMixin
from wan.sender import SendingMixin
from wan.zmq_text import describe_error
from ground.config import WanConfig
from ground.topology import Route
from ground.eventlog import EventLog

WAN_CRASH_EXIT_CODE = 70  # EX_SOFTWARE: the process's WAN I/O thread died (a bug), see `terminate_process`


def terminate_process(reason: str) -> None:
    """What a WanNode does when its I/O thread dies: end the process with a failing status at once.

    `os._exit` skips the main thread's clean-up on purpose: a signal handler or a shutdown path
    there could otherwise still end in exit code 0. The event log is line-buffered, so the
    `wan_thread_crashed` event written just before is on disk.
    """
    os._exit(WAN_CRASH_EXIT_CODE)


class WanNode(SendingMixin, ReceivingMixin):
    def __init__(
        self,
        *,
        name: str,
        run_id: str,
        wan: WanConfig,
        log: EventLog,
        routes: Sequence[Route] = (),
        bind: str | None = None,
        server_links: dict[str, str] | None = None,
        members: Sequence[str] = (),
        keys_dir: str | None = None,
        epoch: int = 0,
        on_crash: Callable[[str], None] = terminate_process,
    ) -> None:
        self.name = name
        self.run_id = run_id
        self.wan = wan
        self.log = log
        self.routes = {r.peer: r for r in routes}
        self.bind = bind
        # peer name -> link name its traffic to our ROUTER crosses (for server-side counting)
        self.server_links = dict(server_links or {})
        self.counters = ByteCounters()
        self.inc = random.SystemRandom().getrandbits(62) or 1  # this process's incarnation
        self.epoch = epoch
        self.step = 0
        self._fence = Fence(run_id, epoch, frozenset(members))
        self._keys_dir = keys_dir
        self._ctx = zmq.Context(io_threads=1)
        self._auth = None
        self._lock = threading.Lock()
        # (dest, frames, cls, reliable, seq, fenced epoch: the message's epoch, or None for a kind the
        # receiver's fence does not check, which can never be superseded)
        self._outbox: collections.deque[tuple[str, list[Any], str, bool, int, int | None]] = collections.deque()
        # Per destination: reliable delivery's sequence numbers, unacked messages and resend clock.
        self._channels: dict[str, ReliableChannel] = collections.defaultdict(ReliableChannel)
        # dest -> seq -> incarnation of the peer process that acked it (the last ACKED_KEPT per dest),
        # and member -> incarnation it was last heard from (`peer_incarnation`): together they tell a waiting
        # request that the process which took it is gone (`acked_by`, `peer_incarnation`).
        self._acked_by: dict[str, collections.OrderedDict[int, int]] = collections.defaultdict(collections.OrderedDict)
        self._peer_inc: dict[str, int] = {}
        # member -> incarnation -> window (the last INCARNATIONS_KEPT incarnations, oldest first)
        self._seen: dict[str, collections.OrderedDict[int, SeqWindow]] = collections.defaultdict(
            collections.OrderedDict)
        self._queues: dict[str, Inbox] = {}
        # member -> the ROUTER routing id that last delivered an authenticated message from it
        self._peer_rid: dict[str, bytes] = {}
        self._on_crash = on_crash
        self.periodic = Periodic()  # the I/O thread's periodic tasks (heartbeats)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_addr = f"inproc://wake-{id(self)}"
        # Per DEALER route: up or down, and what it was handed recently (`doubt` counters on a disconnect)
        self.route_states = RouteStates()
        self.dropped_while_down = 0  # unreliable messages not sent because their link was down
        self.rejected = 0
        self.crashed: str | None = None
        self.duplicates = 0
        self.retransmits = 0
        self.superseded = 0  # unacked reliable messages dropped: their receiver's fence moved past their epoch
        self.refused_over_cap = 0  # reliable messages refused: their destination held too much unacked (WanConfig)
        self.refused_undeliverable = 0  # messages refused: over a receiver's size limits (frames.undeliverable)
        self.refused_by_peer = 0  # reliable messages a peer refused for good (`refused` notices, wan.receiver)
        # ROUTER connections, for the coordinator's failure detection (`lost_connections`)
        self.router_connections = RouterConnections()
        # Acks for a peer this node reaches over its own client route, held while that route is down
        # and sent when it is up again (wan/receiver.py `_send_ack`).
        self._held_acks: dict[str, collections.deque[list[Any]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=HELD_ACKS_MAX))

    # ---------------------------------------------------------------- public API
    def inbox(self, *kinds: str, max_messages: int = INBOX_MAX_MESSAGES, max_bytes: int = INBOX_MAX_BYTES) -> Inbox:
        """A bounded queue that receives every delivered message of these kinds (register before start).

        A message of a kind no inbox was registered for is rejected (`unknown_kind`).
        """
        q = Inbox(max_messages, max_bytes)
        for k in kinds:
            self._queues[k] = q
        return q

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds this node delivers (registered inboxes)."""
        return frozenset(self._queues)

    def every(self, interval_ms: float, fn: Callable[[], None]) -> None:
        """Run fn on the I/O thread every interval (heartbeats). fn may call send()."""
        self.periodic.add(interval_ms / 1000.0, fn)

    def set_fence(self, epoch: int, members: Sequence[str] | None = None) -> None:
        with self._lock:
            self.epoch = epoch
            self._fence = Fence(self.run_id, epoch, frozenset(members) if members is not None else self._fence.members)

    @property
    def fence(self) -> Fence:
        return self._fence

    def send(
        self,
        dest: str,
        kind: str,
        cls: str,
        body: dict[str, Any] | None = None,
        arrays: Sequence[np.ndarray] = (),
        *,
        reliable: bool = True,
        epoch: int | None = None,
        step: int | None = None,
    ) -> int:
        """Queue a message for `dest`; returns its seq (0 if unreliable). Arrays are copied once. A reliable
        message past `dest`'s unacked cap, or any message over a receiver's size limits, is refused:
        logged as `send_refused`, nothing queued, 0 returned."""
        owned = [np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=a.dtype).reshape(a.shape) for a in arrays]
        with self._lock:
            seq = 0
            if reliable:
                ch = self._channels[dest]
                why = ch.over(self.wan.max_unacked_messages, self.wan.max_unacked_mib * 1024 * 1024)
                if why is not None:
                    self.refused_over_cap += 1
                    n = self.refused_over_cap
                    if n == 1 or n % 1000 == 0:  # the first and every 1,000th: a flood is one line per 1,000
                        self.log.emit("send_refused", dest=dest, kind=kind,
                                      reason=f"{dest} holds {why}: not served until it acks ({n} refused so far)")
                    return 0
                seq = ch.peek_seq()  # taken below, once the message is known to be deliverable
            ep = self.epoch if epoch is None else epoch
            frames = encode(kind=kind, cls=cls, run=self.run_id, epoch=ep,
                            step=self.step if step is None else step, src=self.name, inc=self.inc, seq=seq,
                            body=body, arrays=owned)
            why = undeliverable(frames, max_frame_bytes=self.wan.max_frame_bytes,
                                max_header_bytes=self.wan.max_header_bytes)
            if why is not None:  # every receiver would refuse it unread, never ack it: refused here, once
                self.refused_undeliverable += 1
                self.log.emit("send_refused", dest=dest, kind=kind, reason=f"undeliverable: {why}")
                return 0
            if reliable:
                taken = ch.next_seq()  # not inside the assert: `python -O` would drop the call
                assert taken == seq
            self._outbox.append((dest, frames, cls, reliable, seq, None if kind in UNFENCED_KINDS else ep))
        self._wake()
        return seq

    def lost_connections(self) -> dict[str, int]:
        """Members whose connection to this node's ROUTER closed, with the mono ns it closed at,
        that sent nothing since (a message from a member removes it: it is connected again)."""
        return self.router_connections.lost()

    def check(self) -> None:
        """Raise if the I/O thread died: a process must not wait forever on a dead endpoint."""
        if self.crashed is not None:
            raise RuntimeError(f"WAN I/O thread of {self.name} crashed: {self.crashed}")

    def unacked(self, dest: str | None = None) -> int:
        """Reliable messages not yet acked, including those still queued to be sent."""
        with self._lock:
            queued = sum(1 for d, _f, _c, rel, *_ in self._outbox if rel and (dest is None or d == dest))
            if dest is not None:
                ch = self._channels.get(dest)
                return queued + (ch.outstanding() if ch is not None else 0)
            return queued + sum(ch.outstanding() for ch in self._channels.values())

    def unacked_bytes(self, dest: str) -> int:
        """Wire bytes of the reliable messages to `dest` not yet acked, including those still queued:
        what this node holds (and resends) for that peer."""
        with self._lock:
            queued = sum(sum(getattr(f, "nbytes", None) or len(f) for f in frames)
                         for d, frames, _c, rel, *_ in self._outbox if rel and d == dest)
            ch = self._channels.get(dest)
            return queued + (ch.outstanding_bytes() if ch is not None else 0)

    def acked_by(self, dest: str, seq: int) -> int | None:
        """The incarnation of the `dest` process that acked reliable message `seq`, or None (not acked
        yet, or acked so long ago it is forgotten)."""
        with self._lock:
            return self._acked_by.get(dest, {}).get(seq)

    def peer_incarnation(self, member: str) -> int | None:
        """The incarnation of the `member` process heard from last, or None (none yet): any message that
        came over this node's own client connection to `member` (its server key verified), or an ack
        (or stale notice) of one of this process's messages from anywhere. Other messages on the
        ROUTER do not count: an insider holding `member`'s key could send them from a connection of
        its own with any incarnation and make a waiting request believe its process restarted
        (tests/live/test_insider_fuzz.py found this); an ack names this process's random incarnation,
        which only a process that received its messages knows."""
        return self._peer_inc.get(member)

    def queued(self, dest: str) -> int:
        """Messages for `dest` still in the outbox: not yet handed to ZeroMQ, so not counted as sent."""
        with self._lock:
            return sum(1 for d, *_ in self._outbox if d == dest)

    def wait_handed(self, dest: str, timeout_s: float) -> bool:
        """Wait until nothing for `dest` is left in the outbox (True), at most `timeout_s`. A reliable
        message whose route is down leaves the outbox parked, uncounted until it is handed over."""
        return self._wait_for(lambda: self.queued(dest) == 0, timeout_s)

    def wait_acked(self, timeout_s: float, dest: str | None = None) -> bool:
        return self._wait_for(lambda: self.unacked(dest) == 0, timeout_s)

    @staticmethod
    def _wait_for(done: Callable[[], bool], timeout_s: float) -> bool:
        """Poll `done` every 5 ms until it holds (True) or `timeout_s` passed (its last answer)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done():
                return True
            time.sleep(0.005)
        return done()

    def start(self) -> None:
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, errors), name=f"wan-{self.name}", daemon=True)
        self._thread.start()
        ready.wait(10)
        if errors:
            raise errors[0]

    def final_counters(self) -> dict[str, Any]:
        """The last counters of this incarnation (log them after `close()`, when nothing can be sent)."""
        return {"counters": self.counters.snapshot(), "rejected": self.rejected, "duplicates": self.duplicates,
                "retransmits": self.retransmits, "superseded": self.superseded,
                "dropped_while_down": self.dropped_while_down, "final": True}

    @property
    def closed(self) -> bool:
        """Whether the ZeroMQ context is terminated (after a complete `close()`)."""
        return bool(self._ctx.closed)

    def route_down(self, peer: str) -> bool:
        """Whether this node's own route (DEALER) to `peer` is down now (between a disconnect and the
        next handshake): reliable messages for `peer` wait, parked, until it is up again."""
        return self.route_states.is_down(peer)

    def parked(self, dest: str) -> int:
        """Reliable messages for `dest` taken off the outbox that were never handed to ZeroMQ (their
        route was down when they were sent)."""
        with self._lock:
            ch = self._channels.get(dest)
            return ch.parked() if ch is not None else 0

    def handed(self, dest: str) -> int:
        """Reliable messages for `dest` handed to ZeroMQ and not acked yet."""
        with self._lock:
            ch = self._channels.get(dest)
            return ch.in_flight() if ch is not None else 0

    def close(self, timeout_s: float = 2.0) -> bool:
        """Stop the I/O thread and terminate the ZeroMQ context: True if both happened. An I/O thread
        still running `timeout_s` after the stop (wedged in a call) keeps its sockets open, and
        terminating the context would block on them forever: the context is then left to the
        process's exit, and `wan_close_incomplete` says so in the log (False)."""
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._auth is not None:
            self._auth.stop()
        if self._thread is not None and self._thread.is_alive():
            self.log.emit("wan_close_incomplete", timeout_s=timeout_s,
                          reason=f"the WAN I/O thread was still running {timeout_s:g} s after the stop; its "
                                 "ZeroMQ context is left open (terminating it would block on the thread's sockets)")
            return False
        if not self._ctx.closed:
            self._ctx.term()
        return True

    # ---------------------------------------------------------------- I/O thread
    def _wake(self) -> None:
        with self._lock:
            sock = getattr(self, "_wake_tx", None)
            if sock is not None:
                try:
                    sock.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _open(self) -> None:
        ctx = self._ctx
        self._wake_rx = ctx.socket(zmq.PAIR)
        self._wake_rx.bind(self._wake_addr)
        wake_tx = ctx.socket(zmq.PAIR)
        wake_tx.connect(self._wake_addr)
        with self._lock:
            self._wake_tx = wake_tx
        keypair = None
        if self.wan.curve:
            if not self._keys_dir:
                raise keymod.CurveKeyError("wan.curve is on but no keys directory was given")
            keypair = keymod.load_keypair(self._keys_dir, self.name)
        self._router: zmq.Socket | None = None
        self.monitor = ConnectionMonitor(
            name=self.name, log=self.log, counters=self.counters, routes=self.routes, server_links=self.server_links,
            route_states=self.route_states, router_connections=self.router_connections, periodic=self.periodic,
            on_route_up=self._route_up_again, on_handshake_refused=self._handshake_refused)
        if self.bind is not None:
            if keypair is not None:
                self._auth = keymod.start_authenticator(ctx, self._keys_dir)
            r = sockets.router(ctx, self.wan, keypair)
            self.monitor.watch(r, "server")
            r.bind(self.bind)
            self._router = r
        self._dealers: dict[str, zmq.Socket] = {}
        self._dealer_peer: dict[zmq.Socket, str] = {}
        for peer, route in self.routes.items():
            d = sockets.dealer(ctx, self.wan, self.name, peer, keypair, self._keys_dir)
            self.monitor.watch(d, peer)
            d.connect(route.address)
            self._dealers[peer] = d
            self._dealer_peer[d] = peer
        self._poller = zmq.Poller()
        for sock in (self._wake_rx, self._router, *self._dealers.values(), *self.monitor.sockets):
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)

    def _route_up_again(self, peer: str, reconnect: bool) -> None:
        """The route to `peer` completed a handshake: the acks held for it and what it left unacked go out."""
        self._send_held_acks(peer)
        self._resend_all(peer, "reconnected" if reconnect else "connected")

    def _handshake_refused(self) -> None:
        self.rejected += 1

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            self._open()
        except BaseException as e:  # reported to start()
            # Close what was opened, without lingering: otherwise close()'s ctx.term() would wait
            # forever on a socket nobody will close (a failed bind once hung a test for 600 s).
            if self._auth is not None:
                self._auth.stop()
                self._auth = None
            self._ctx.destroy(linger=0)
            errors.append(e)
            ready.set()
            return
        ready.set()
        try:
            while not self._stop.is_set():
                timeout_ms = self._next_timer_ms()
                for sock, _ev in self._poller.poll(timeout_ms):
                    if sock is self._wake_rx:
                        while True:
                            try:
                                self._wake_rx.recv(zmq.NOBLOCK)
                            except zmq.Again:
                                break
                    elif sock in self.monitor.sockets:
                        self.monitor.on_events(sock)
                    else:
                        self._drain(sock)
                self._flush_outbox()
                self._run_periodic()
                self._check_retransmit()
        except BaseException as e:  # an I/O thread crash must be visible in the log, to callers, and in the exit code
            self.crashed = describe_error(e)
            try:
                self.log.emit("wan_thread_crashed", error=self.crashed, exit_code=WAN_CRASH_EXIT_CODE)
            finally:
                self._on_crash(self.crashed)
            raise
        finally:
            self.monitor.close()
            for d in self._dealers.values():
                d.close()
            if self._router is not None:
                self._router.close()
            self._wake_rx.close(0)
            with self._lock:
                self._wake_tx.close(0)
                self._wake_tx = None

    def _next_timer_ms(self) -> int:
        return self.periodic.sleep_ms(time.monotonic())

    def _run_periodic(self) -> None:
        for fn in self.periodic.due(time.monotonic()):
            try:
                fn()
            except Exception as e:
                self.log.emit("periodic_task_failed", error=f"{type(e).__name__}: {e}")
        self._flush_outbox()
