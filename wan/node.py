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
"""

from __future__ import annotations

import collections
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from wan import keys as keymod
from wan.counters import ByteCounters
from wan.frames import Fence, FrameError, Message, check_fence, decode, encode, wire_overhead
from xdc.config import WanConfig
from xdc.eventlog import EventLog

_EVENT_NAMES = {getattr(zmq, n): n[len("EVENT_"):].lower() for n in dir(zmq) if n.startswith("EVENT_")
                and n not in ("EVENT_ALL", "EVENT_ALL_V1", "EVENT_ALL_V2")}


@dataclass(frozen=True)
class Route:
    """How this process reaches `peer`: through proxy `link` listening at `address`."""

    peer: str
    link: str
    address: str  # tcp://host:port of the Toxiproxy listener


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


class _SeqWindow:
    """Seen sequence numbers of one (source, incarnation): a low-water mark plus a sparse set."""

    def __init__(self) -> None:
        self.low = 0  # every seq <= low has been seen
        self.above: set[int] = set()

    def seen_before(self, seq: int) -> bool:
        if seq <= self.low or seq in self.above:
            return True
        self.above.add(seq)
        while self.low + 1 in self.above:
            self.low += 1
            self.above.discard(self.low)
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
        self._seen: dict[tuple[str, int], _SeqWindow] = collections.defaultdict(_SeqWindow)
        self._queues: dict[str, queue.Queue[Message]] = {}
        self.default_inbox: queue.Queue[Message] = queue.Queue()
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

    # ---------------------------------------------------------------- public API
    def inbox(self, *kinds: str) -> queue.Queue[Message]:
        """A queue that receives every delivered message of these kinds (register before start)."""
        q: queue.Queue[Message] = queue.Queue()
        for k in kinds:
            self._queues[k] = q
        return q

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
                raise keymod.KeyError_("wan.curve is on but no keys directory was given")
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
            d.setsockopt(zmq.ROUTING_ID, self.name.encode())
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
        except BaseException as e:  # an I/O thread crash must be visible in the log and to callers
            self.crashed = f"{type(e).__name__}: {e}"
            self.log.emit("wan_thread_crashed", error=self.crashed)
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
                self._router.send_multipart([dest.encode(), *frames], flags=zmq.NOBLOCK, copy=False)
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
                parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if sock is self._router:
                ident = parts[0].bytes.decode("utf-8", "replace")
                self._on_frames(parts[1:], via=ident, from_router=True)
            else:
                self._on_frames(parts, via=self._dealer_peer[sock], from_router=False)

    def _rx_link(self, via: str, from_router: bool) -> tuple[str, str]:
        if from_router:
            return self.server_links.get(via, f"{via}_to_{self.name}"), "up"
        return self.routes[via].link, "down"

    def _on_frames(self, parts: list[Any], *, via: str, from_router: bool) -> None:
        link, direction = self._rx_link(via, from_router)
        try:
            msg = decode(parts, max_frame_bytes=self.wan.max_frame_bytes, max_header_bytes=self.wan.max_header_bytes)
        except FrameError as e:
            self.rejected += 1
            size = sum(len(p.buffer) for p in parts)
            self.counters.add("rx", link, direction, "control", size)
            self.log.emit("frame_rejected", reason=e.reason, detail=e.detail, peer=via, link=link, bytes=size)
            return
        ok, reason = check_fence(msg, self._fence)
        if ok and from_router and msg.src != via:
            ok, reason = False, f"identity_mismatch: routing id {via!r} claims to be {msg.src!r}"
        self.counters.add("rx", link, direction, msg.cls, msg.wire_bytes + wire_overhead(
            [len(p.buffer) for p in parts], self.wan.curve))
        if not ok:
            self.rejected += 1
            self.log.emit("frame_rejected", reason=reason.split(":")[0], detail=reason, peer=via, link=link,
                          kind=msg.kind, msg_epoch=msg.epoch, msg_run=msg.run, src=msg.src)
            return
        if msg.kind == "ack":
            self._on_ack(msg)
            return
        if msg.seq > 0:
            ack = encode(kind="ack", cls="control", run=self.run_id, epoch=self.epoch, step=self.step,
                         src=self.name, inc=self.inc, seq=0, body={"seq": msg.seq, "inc": msg.inc})
            self._raw_send(via, ack, "control")
            if self._seen[(msg.src, msg.inc)].seen_before(msg.seq):
                self.duplicates += 1
                return
        self._queues.get(msg.kind, self.default_inbox).put(msg)

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
                if name.startswith("handshake_failed"):
                    self.rejected += 1
                    self.log.emit("frame_rejected", reason=name, detail=f"ZMTP/CURVE handshake failed (code {ev['value']})",
                                  peer=endpoint, link="server")
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
                self._resend_all(peer, "reconnected" if reconnect else "connected")
            elif name.startswith("handshake_failed"):
                self.log.emit("handshake_failed", peer=peer, link=self.routes[peer].link, zmq_event=name, code=ev["value"])


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


def _wire(frames: list[Any], curve: bool) -> int:
    sizes = [len(f) if not isinstance(f, zmq.Frame) else len(f.buffer) for f in frames]
    return sum(sizes) + wire_overhead(sizes, curve)

