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
"""

from __future__ import annotations

import collections
import os
import queue
import random
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from wan import keys as keymod
from wan.counters import ByteCounters
from wan.frames import (
    MAX_BUFFERS,
    Fence,
    FrameError,
    Message,
    check_fence,
    decode,
    encode,
    safe_repr,
    wire_overhead,
)
from ground.config import WanConfig
from ground.topology import Route
from ground.eventlog import EventLog

_EVENT_NAMES = {getattr(zmq, n): n[len("EVENT_"):].lower() for n in dir(zmq) if n.startswith("EVENT_")
                and n not in ("EVENT_ALL", "EVENT_ALL_V1", "EVENT_ALL_V2")}
# The value of a HANDSHAKE_FAILED_PROTOCOL event (e.g. "zmtp_mechanism_mismatch": a peer without CURVE).
_PROTOCOL_ERRORS = {getattr(zmq, n): n[len("PROTOCOL_ERROR_"):].lower() for n in dir(zmq)
                    if n.startswith("PROTOCOL_ERROR_")}


@dataclass
class _Pending:
    frames: list[Any]
    cls: str
    wire: int
    first_sent_ns: int
    last_sent_ns: int
    handed: bool = False  # handed to ZeroMQ at least once (a later send is a resend)


# A message handed to ZeroMQ this long before its connection was seen to close may have died in
# the connection's buffers without reaching the proxy: its bytes are "in doubt" (ns).
DOUBT_WINDOW_NS = 250_000_000

WAN_CRASH_EXIT_CODE = 70  # EX_SOFTWARE: the process's WAN I/O thread died (a bug), see `terminate_process`
INBOX_MAX_MESSAGES = 65_536  # per inbox; more is rejected as inbox_full (not acked: the sender resends)
INBOX_MAX_BYTES = 256 * 1024 * 1024  # per inbox, wire bytes of the messages it holds
SEQ_WINDOW = 65_536  # a reliable seq may be at most this far above its window's low mark
INCARNATIONS_KEPT = 8  # sequence windows kept per member (its latest incarnations)
ROUTING_ID_SEP = "#"  # a DEALER's routing id is f"{name}#{random hex}"
# A DEALER to the coordinator retries a closed connection this often (ZeroMQ's default, kept for
# the other routes, is 100 ms; both plus up to as much random jitter). A live site whose connection
# closed (a healed blackhole) is back and heard well within the coordinator's disconnect grace
# (coordinator/membership.py). Only that route: a retry to a dead peer through its proxy is
# accepted, then closed, and logged; there is no point in doing that faster elsewhere.
RECONNECT_IVL_MS = 40
FAST_RECONNECT_PEERS = frozenset({"coord"})  # ground.topology.COORD (not imported: topology imports this module)


def terminate_process(reason: str) -> None:
    """What a WanNode does when its I/O thread dies: end the process with a failing status at once.

    `os._exit` skips the main thread's clean-up on purpose: a signal handler or a shutdown path
    there could otherwise still end in exit code 0. The event log is line-buffered, so the
    `wan_thread_crashed` event written just before is on disk.
    """
    os._exit(WAN_CRASH_EXIT_CODE)


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


class _SeqWindow:
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


class WanNode:
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
        self._outbox: collections.deque[tuple[str, list[Any], str, bool, int]] = collections.deque()
        self._seq: dict[str, int] = collections.defaultdict(int)
        self._unacked: dict[str, collections.OrderedDict[int, _Pending]] = collections.defaultdict(collections.OrderedDict)
        self._last_ack_ns: dict[str, int] = collections.defaultdict(int)
        # member -> incarnation -> window (the last INCARNATIONS_KEPT incarnations, oldest first)
        self._seen: dict[str, collections.OrderedDict[int, _SeqWindow]] = collections.defaultdict(
            collections.OrderedDict)
        self._queues: dict[str, Inbox] = {}
        # member -> the ROUTER routing id that last delivered an authenticated message from it
        self._peer_rid: dict[str, bytes] = {}
        self._on_crash = on_crash
        self._periodic: list[tuple[float, Callable[[], None], list[float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_addr = f"inproc://wake-{id(self)}"
        # Per DEALER route: (mono_ns, cls, wire bytes) of what was handed to ZeroMQ recently, so a
        # disconnect can say which bytes may have died in the connection (`doubt` counters).
        self._recent: dict[str, collections.deque[tuple[int, str, int]]] = collections.defaultdict(collections.deque)
        self.dropped_while_down = 0  # unreliable messages not sent because their link was down
        self.rejected = 0
        self.crashed: str | None = None
        self.duplicates = 0
        self.retransmits = 0
        # ROUTER connections, for the coordinator's failure detection (`lost_connections`): the
        # member each connection (file descriptor, ZMQ_SRCFD) last authenticated as, the newest
        # connection of each member, and member -> mono ns at which its newest connection closed,
        # while nothing has come from it since.
        self._fd_peer: dict[int, str] = {}
        self._peer_fd: dict[str, int] = {}
        self._lost: dict[str, int] = {}

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
        self._periodic.append((interval_ms / 1000.0, fn, [0.0]))

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
        """Queue a message for `dest`; returns its seq (0 if unreliable). Arrays are copied once."""
        owned = [np.frombuffer(np.ascontiguousarray(a).tobytes(), dtype=a.dtype).reshape(a.shape) for a in arrays]
        with self._lock:
            seq = 0
            if reliable:
                self._seq[dest] += 1
                seq = self._seq[dest]
            frames = encode(kind=kind, cls=cls, run=self.run_id, epoch=self.epoch if epoch is None else epoch,
                            step=self.step if step is None else step, src=self.name, inc=self.inc, seq=seq,
                            body=body, arrays=owned)
            self._outbox.append((dest, frames, cls, reliable, seq))
        self._wake()
        return seq

    def lost_connections(self) -> dict[str, int]:
        """Members whose connection to this node's ROUTER closed, with the mono ns it closed at,
        that sent nothing since (a message from a member removes it: it is connected again)."""
        with self._lock:
            return dict(self._lost)

    def check(self) -> None:
        """Raise if the I/O thread died: a process must not wait forever on a dead endpoint."""
        if self.crashed is not None:
            raise RuntimeError(f"WAN I/O thread of {self.name} crashed: {self.crashed}")

    def unacked(self, dest: str | None = None) -> int:
        """Reliable messages not yet acked, including those still queued to be sent."""
        with self._lock:
            queued = sum(1 for d, _f, _c, rel, _s in self._outbox if rel and (dest is None or d == dest))
            if dest is not None:
                return queued + len(self._unacked.get(dest, {}))
            return queued + sum(len(v) for v in self._unacked.values())

    def wait_acked(self, timeout_s: float, dest: str | None = None) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.unacked(dest) == 0:
                return True
            time.sleep(0.005)
        return self.unacked(dest) == 0

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
                "retransmits": self.retransmits, "dropped_while_down": self.dropped_while_down, "final": True}

    def close(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._auth is not None:
            self._auth.stop()
        if self._thread is None or not self._thread.is_alive():
            self._ctx.term()

    # ---------------------------------------------------------------- I/O thread
    def _wake(self) -> None:
        with self._lock:
            sock = getattr(self, "_wake_tx", None)
            if sock is not None:
                try:
                    sock.send(b"", zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _configure(self, s: zmq.Socket) -> None:
        w = self.wan
        s.setsockopt(zmq.LINGER, w.linger_ms)
        # ZMTP heartbeats notice a silent blackhole where TCP stays up (values in ms).
        s.setsockopt(zmq.HEARTBEAT_IVL, w.zmq_heartbeat_ivl_ms)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(w.zmq_heartbeat_ivl_ms * 3, 1000))
        s.setsockopt(zmq.HEARTBEAT_TTL, max(w.zmq_heartbeat_ivl_ms * 3, 1000))
        # Checked per frame before allocation; the header frame limit is separate and smaller.
        s.setsockopt(zmq.MAXMSGSIZE, w.max_frame_bytes + 1024)
        s.setsockopt(zmq.SNDHWM, 10_000)
        s.setsockopt(zmq.RCVHWM, 10_000)

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
        self._monitors: dict[zmq.Socket, tuple[str, zmq.Socket]] = {}
        if self.bind is not None:
            r = ctx.socket(zmq.ROUTER)
            self._configure(r)
            r.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished peer raises instead of dropping
            r.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a rejoining peer may reuse its identity
            if keypair is not None:
                self._auth = keymod.start_authenticator(ctx, self._keys_dir)
                r.curve_server = True
                r.curve_publickey = keypair.public
                r.curve_secretkey = keypair.secret
            self._monitors[r.get_monitor_socket()] = ("server", r)
            r.bind(self.bind)
            self._router = r
        self._dealers: dict[str, zmq.Socket] = {}
        self._dealer_peer: dict[zmq.Socket, str] = {}
        self._ever_up: dict[str, bool] = {}
        self._down: dict[str, bool] = {}
        for peer, route in self.routes.items():
            d = ctx.socket(zmq.DEALER)
            self._configure(d)
            # A fresh unguessable id per socket: see the module docstring (identity is the key's).
            d.setsockopt(zmq.ROUTING_ID, f"{self.name}{ROUTING_ID_SEP}{secrets.token_hex(8)}".encode())
            if peer in FAST_RECONNECT_PEERS:
                d.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            if keypair is not None:
                d.curve_publickey = keypair.public
                d.curve_secretkey = keypair.secret
                d.curve_serverkey = keymod.load_public(self._keys_dir, peer)
            self._monitors[d.get_monitor_socket()] = (peer, d)
            d.connect(route.address)
            self._dealers[peer] = d
            self._dealer_peer[d] = peer
        self._poller = zmq.Poller()
        self._poller.register(self._wake_rx, zmq.POLLIN)
        if self._router is not None:
            self._poller.register(self._router, zmq.POLLIN)
        for d in self._dealers.values():
            self._poller.register(d, zmq.POLLIN)
        for m in self._monitors:
            self._poller.register(m, zmq.POLLIN)

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            self._open()
        except BaseException as e:  # reported to start()
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
                    elif sock in self._monitors:
                        self._on_monitor(sock)
                    else:
                        self._drain(sock)
                self._flush_outbox()
                self._run_periodic()
                self._check_retransmit()
        except BaseException as e:  # an I/O thread crash must be visible in the log, to callers, and in the exit code
            self.crashed = _describe(e)
            try:
                self.log.emit("wan_thread_crashed", error=self.crashed, exit_code=WAN_CRASH_EXIT_CODE)
            finally:
                self._on_crash(self.crashed)
            raise
        finally:
            for s in list(self._monitors):
                s.close(0)
            for d in self._dealers.values():
                d.close()
            if self._router is not None:
                self._router.close()
            self._wake_rx.close(0)
            with self._lock:
                self._wake_tx.close(0)
                self._wake_tx = None

    def _next_timer_ms(self) -> int:
        now = time.monotonic()
        t = 50.0
        for interval, _fn, last in self._periodic:
            t = min(t, max(0.0, (last[0] + interval - now) * 1000))
        return int(t) + 1

    def _run_periodic(self) -> None:
        now = time.monotonic()
        for interval, fn, last in self._periodic:
            if now - last[0] >= interval:
                last[0] = now
                try:
                    fn()
                except Exception as e:
                    self.log.emit("periodic_task_failed", error=f"{type(e).__name__}: {e}")
        self._flush_outbox()

    # ---------------------------------------------------------------- sending
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
        return dest not in self._dealers or (self._ever_up.get(dest, False) and not self._down.get(dest, False))

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
        wire = _wire(frames, self.wan.curve)
        self.counters.add(side, link, direction, cls, wire)
        if dest in self._dealers:
            now = time.monotonic_ns()
            recent = self._recent[dest]
            recent.append((now, cls, wire))
            while recent and now - recent[0][0] > DOUBT_WINDOW_NS:
                recent.popleft()
        return True

    def _flush_outbox(self) -> None:
        while True:
            with self._lock:
                if not self._outbox:
                    return
                dest, frames, cls, reliable, seq = self._outbox.popleft()
                if reliable:
                    now = time.monotonic_ns()
                    pend = self._unacked[dest]
                    if not pend:
                        self._last_ack_ns[dest] = now  # the no-progress clock starts when something is outstanding
                    pend[seq] = _Pending(frames, cls, _wire(frames, self.wan.curve), now, now)
            if dest in self._dealers and not self._route_up(dest):
                if not reliable:
                    self.dropped_while_down += 1
                continue  # a reliable message waits in _unacked for the handshake
            sent = self._raw_send(dest, frames, cls)
            if sent and reliable:
                with self._lock:
                    p = self._unacked[dest].get(seq)
                    if p is not None:
                        p.handed = True
            if not sent and not reliable:
                self.log.emit("send_dropped", dest=dest, kind_cls=cls, reason="peer unreachable or queue full")
            if not sent and dest in self._dealers:
                # Queue full: try again on the next loop rather than spin.
                if not reliable:
                    continue
                return

    def _resend_all(self, dest: str, why: str) -> None:
        with self._lock:
            pend = list(self._unacked.get(dest, {}).items())
        if not pend:
            return
        now = time.monotonic_ns()
        nbytes = resent = first = 0
        for _seq, p in pend:
            was_handed = p.handed
            if self._raw_send(dest, p.frames, p.cls):
                p.last_sent_ns = now
                p.handed = True
                if was_handed:
                    nbytes += p.wire
                    resent += 1
                else:
                    first += 1  # parked while the route was down: its first send, not a resend
        with self._lock:
            self._last_ack_ns[dest] = now
        self.retransmits += resent
        if resent:
            self.log.emit("retransmit", dest=dest, messages=resent, wire_bytes=nbytes, reason=why)
        if first:
            self.log.emit("parked_sent", dest=dest, messages=first, reason=why)

    def _check_retransmit(self) -> None:
        now = time.monotonic_ns()
        timeout_ns = self.wan.retransmit_timeout_ms * 1_000_000
        with self._lock:
            due = [d for d, pend in self._unacked.items() if pend and now - self._last_ack_ns[d] > timeout_ns]
        for d in due:
            self._resend_all(d, f"no ack progress for {self.wan.retransmit_timeout_ms} ms")

    # ---------------------------------------------------------------- receiving
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
                via = _peer_text(kept[0]) if sock is self._router else self._dealer_peer.get(sock, "?")
                self.log.emit("frame_rejected", reason="handler_error", detail=_describe(e), peer=via)

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
            parts, via = kept[1:], _peer_text(rid)
        else:
            peer = self._dealer_peer[sock]
            link, direction = self._rx_link(peer, from_router=False)
            parts, via = kept, peer
        if over is not None or not parts:
            reason, detail = (over or "empty: no frames after the routing id").split(": ", 1)
            self._reject_raw(reason, detail, via, link, direction, n_bytes, frames=n_frames)
            return
        fd = _src_fd(parts[-1]) if sock is self._router else None
        self._on_frames(parts, peer=peer, via=via, link=link, direction=direction,
                        rid=rid if sock is self._router else None, fd=fd)

    def _router_peer(self, rid: bytes, frame: zmq.Frame | None) -> str:
        """The member a ROUTER connection belongs to: its key's User-Id under CURVE, else the name in its id."""
        if self.wan.curve and frame is not None:
            try:
                user = frame.get("User-Id")
            except zmq.ZMQError:
                user = None
            if user:
                return str(user)
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
        if rid is None:  # a DEALER: the server proved its key in the handshake
            if msg.src != peer:
                return f"identity_mismatch: the connection to {peer!r} delivered a message from {safe_repr(msg.src)}"
            return None
        claimed = rid.decode("utf-8", "replace").rsplit(ROUTING_ID_SEP, 1)[0]
        if msg.src != peer or claimed != peer:
            who = "key" if self.wan.curve else "routing id"
            return (f"identity_mismatch: {who} of {peer!r}, routing id {safe_repr(_peer_text(rid))}, "
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
        if reason is None:
            ok, why = check_fence(msg, self._fence)
            reason = None if ok else why
        if reason is None and msg.kind != "ack" and msg.kind not in self._queues:
            reason = f"unknown_kind: no inbox for kind {safe_repr(msg.kind)}"
        if reason is None and msg.seq > 0 and not self._window(msg).in_window(msg.seq):
            reason = f"seq_window: seq {msg.seq} is more than {SEQ_WINDOW} above {self._window(msg).low}"
        if reason is not None:
            self.rejected += 1
            self.log.emit("frame_rejected", reason=reason.split(":")[0], detail=reason, peer=via, link=link,
                          kind=msg.kind, msg_epoch=msg.epoch, msg_run=msg.run, src=msg.src)
            return
        if rid is not None:
            self._note_connection(msg.src, fd)
            self._learn_peer(msg.src, rid)
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
            self.log.emit("frame_rejected", reason="inbox_full", peer=peer, kind=msg.kind, src=msg.src,
                          detail=f"inbox of {msg.kind!r} holds {inbox.qsize()} messages, {inbox.nbytes} bytes")
            return
        if window is not None:
            window.mark(msg.seq)
            self._send_ack(peer, msg)

    def _send_ack(self, peer: str, msg: Message) -> None:
        ack = encode(kind="ack", cls="control", run=self.run_id, epoch=self.epoch, step=self.step,
                     src=self.name, inc=self.inc, seq=0, body={"seq": msg.seq, "inc": msg.inc})
        self._raw_send(peer, ack, "control")

    def _window(self, msg: Message) -> _SeqWindow:
        """The sequence window of (msg.src, msg.inc); only the latest INCARNATIONS_KEPT per member are kept."""
        per_src = self._seen[msg.src]
        w = per_src.get(msg.inc)
        if w is None:
            w = per_src[msg.inc] = _SeqWindow()
            while len(per_src) > INCARNATIONS_KEPT:
                per_src.popitem(last=False)
        return w

    def _learn_peer(self, peer: str, rid: bytes) -> None:
        """Route replies to `peer` through the connection that just proved to be it; flush what waited."""
        old = self._peer_rid.get(peer)
        if old == rid:
            return
        self._peer_rid[peer] = rid
        self._resend_all(peer, "peer reconnected" if old is not None else "peer connected")

    def _on_ack(self, msg: Message) -> None:
        seq = msg.body.get("seq")
        if msg.body.get("inc") != self.inc or not isinstance(seq, int):
            return  # an ack for a previous incarnation of this process
        with self._lock:
            pend = self._unacked.get(msg.src)
            if pend is not None and pend.pop(seq, None) is not None:
                self._last_ack_ns[msg.src] = time.monotonic_ns()

    def _on_monitor(self, msock: zmq.Socket) -> None:
        peer, _sock = self._monitors[msock]
        while True:
            try:
                ev = recv_monitor_message(msock, zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return
            name = _EVENT_NAMES.get(ev["event"], str(ev["event"]))
            endpoint = ev.get("endpoint", b"")
            endpoint = endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)
            if peer == "server":
                if name == "disconnected":
                    self._on_router_disconnect(int(ev["value"]))
                    continue
                if name.startswith("handshake_failed"):
                    self.rejected += 1
                    what = _PROTOCOL_ERRORS.get(ev["value"], "") if name == "handshake_failed_protocol" else ""
                    self.log.emit("frame_rejected", reason=name, code=ev["value"], peer=endpoint, link="server",
                                  detail=f"ZMTP/CURVE handshake failed (code {ev['value']}{', ' + what if what else ''})")
                continue
            if name == "disconnected":
                self._down[peer] = True
                doubt = self._mark_in_doubt(peer, time.monotonic_ns())
                self.log.emit("link_down", peer=peer, link=self.routes[peer].link, in_doubt_bytes=doubt)
            elif name == "handshake_succeeded":
                was_down = self._down.get(peer, False)
                reconnect = was_down or self._ever_up.get(peer, False)
                self._down[peer] = False
                self._ever_up[peer] = True
                if reconnect:
                    self.log.emit("link_up", peer=peer, link=self.routes[peer].link, reconnect=True)
                    for _interval, _fn, last in self._periodic:
                        last[0] = 0.0  # heartbeats go out at once: the peer hears we are alive
                self._resend_all(peer, "reconnected" if reconnect else "connected")
            elif name.startswith("handshake_failed"):
                self.log.emit("handshake_failed", peer=peer, link=self.routes[peer].link, zmq_event=name, code=ev["value"])


    def _note_connection(self, peer: str, fd: int | None) -> None:
        """An authenticated message from `peer` arrived on connection `fd`: it is connected."""
        if fd is not None and self._peer_fd.get(peer) != fd:
            old = self._peer_fd.get(peer)
            if old is not None and self._fd_peer.get(old) == peer:
                del self._fd_peer[old]
            self._fd_peer[fd] = peer
            self._peer_fd[peer] = fd
        if peer in self._lost:
            with self._lock:
                since = self._lost.pop(peer, None)
            if since is not None:  # how long a live peer was unheard after its connection closed
                self.log.emit("peer_reconnected", peer=peer, silent_ms=round((time.monotonic_ns() - since) / 1e6, 1))

    def _on_router_disconnect(self, fd: int) -> None:
        """A ROUTER connection closed. If it was a member's newest one, that member is lost until
        it is heard again (TCP delivers everything sent on a connection before its close, so any
        later message came over a new connection)."""
        peer = self._fd_peer.pop(fd, None)
        if peer is None or self._peer_fd.get(peer) != fd:
            return
        del self._peer_fd[peer]
        now = time.monotonic_ns()
        self.log.emit("peer_disconnected", peer=peer, link=self.server_links.get(peer, f"{peer}_to_{self.name}"),
                      fd=fd)  # logged before anyone can act on it
        with self._lock:
            self._lost[peer] = now

    def _mark_in_doubt(self, peer: str, now_ns: int) -> int:
        """Bytes handed to the route within DOUBT_WINDOW_NS before it closed: counted as sent, but
        they may have died in the connection's buffers. Recorded as side `doubt` (no class owns
        them; the reconciliation allows at most these bytes of excess on the link)."""
        recent = self._recent.pop(peer, None) or collections.deque()
        link = self.routes[peer].link
        total = 0
        for t, cls, wire in recent:
            if now_ns - t <= DOUBT_WINDOW_NS:
                self.counters.add("doubt", link, "up", cls, wire)
                total += wire
        return total


def _describe(e: BaseException) -> str:
    """'Type: message', bounded, even for an exception whose str() raises."""
    try:
        text = str(e)
    except Exception:
        text = "<unprintable>"
    return f"{type(e).__name__}: {text[:300]}"


def _src_fd(frame: Any) -> int | None:
    """The file descriptor of the connection a received frame came over (ZMQ_SRCFD), if known."""
    try:
        fd = frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError):
        return None
    return int(fd) if isinstance(fd, int) and fd >= 0 else None


def _peer_text(rid: Any) -> str:
    try:
        raw = rid.bytes if isinstance(rid, zmq.Frame) else bytes(rid)
    except Exception:
        return "?"
    return raw[:64].decode("utf-8", "replace")


def _wire(frames: list[Any], curve: bool) -> int:
    sizes = [len(f) if not isinstance(f, zmq.Frame) else len(f.buffer) for f in frames]
    return sum(sizes) + wire_overhead(sizes, curve)

