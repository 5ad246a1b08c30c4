"""Peer-to-peer all-reduce (mean) between sites over the WAN, with a fixed reduction order.

Algorithm: direct reduce-scatter, then all-gather, over the full mesh of site links.
The flat float32 vector [P] is cut into n contiguous shards; shard k belongs to member k
(members sorted by name). Each site sends shard k of its vector to member k (phase "rs"),
member k sums the n contributions *in member order* and divides by n, then sends the
reduced shard to every other member (phase "ag"). Every site sends 2(n-1)/n * P values in
total, the same as a ring, so it is bandwidth-optimal; because every shard is summed in one
place in a fixed order, the result is bitwise reproducible and equal to
`reduce_in_order` applied to the n vectors in one process.

Compression (optional): "fp16" casts each part to half precision; "int8" quantises each part
with one absmax scale. A site applies the same compress/decompress to its own contribution
and to its own reduced shard, so all sites end with identical values.

Messages are `coll` messages, traffic class `collective`, reliable (acked, de-duplicated),
cut into parts of at most `chunk_bytes` so a thin link carries them in pieces.

No part is trusted: each is parsed (`site_agent.messages.parse_coll_part`: integer fields,
phase, finite scale, payload dtype/shape/length, finite values) and checked against the shard
it claims to fill; a bad one is logged as `message_rejected` with the reason and dropped. A part
of a later round or a later epoch waits in a buffer bounded in parts and bytes.

Attestation: the first reduce-scatter part a site sends to each member carries, as a second
buffer, the int64 sample ids the site trained in that round; so once a round is done every
member holds every member's ids (`RoundStats.samples`), which the site accumulates as the
samples its lineage retained.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from site_agent.messages import MAX_INT, PAYLOAD_DTYPES, CollLimits, CollPart, Rejected, parse_coll_part
from wan.frames import Message, TrafficClass
from wan.node import WanNode


class CollectiveAborted(RuntimeError):
    """The round could not complete (a peer did not deliver in time, or membership changed)."""


class CollectiveInterrupted(CollectiveAborted):
    """A newer membership epoch (or a stop) arrived while the round was in flight."""


class PeerUnreachable(CollectiveAborted):
    """A peer delivered nothing for longer than the stall timeout while others did."""

    def __init__(self, peer: str, detail: str) -> None:
        super().__init__(detail)
        self.peer = peer


def reduce_in_order(contribs: Sequence[np.ndarray]) -> np.ndarray:
    """Mean of the contributions, summed left to right in float32 (the reference order)."""
    acc = np.array(contribs[0], dtype=np.float32, copy=True)
    for c in contribs[1:]:
        acc += c
    acc /= np.float32(len(contribs))
    return acc


def compress(x: np.ndarray, how: str) -> tuple[np.ndarray, float]:
    """Payload to send for float32 values x, and the int8 scale (1.0 otherwise)."""
    if how == "none":
        return np.ascontiguousarray(x, dtype=np.float32), 1.0
    if how == "fp16":
        return x.astype(np.float16), 1.0
    if how == "int8":
        amax = float(np.max(np.abs(x))) if x.size else 0.0
        scale = amax / 127.0 if amax > 0 else 1.0
        return np.clip(np.rint(x / scale), -127, 127).astype(np.int8), scale
    raise ValueError(f"unknown compression {how!r}")


def decompress(payload: np.ndarray, scale: float) -> np.ndarray:
    if payload.dtype == np.int8:
        return payload.astype(np.float32) * np.float32(scale)
    return payload.astype(np.float32)


def roundtrip(x: np.ndarray, how: str, part_elems: int) -> np.ndarray:
    """What a receiver reconstructs from x sent in parts: applied locally for symmetry."""
    if how == "none":
        return x
    out = np.empty_like(x, dtype=np.float32)
    for off in range(0, x.size, part_elems):
        p, s = compress(x[off:off + part_elems], how)
        out[off:off + part_elems] = decompress(p, s)
    return out


@dataclass
class RoundStats:
    round: int
    payload_bytes_sent: int = 0
    messages_sent: int = 0
    wait_s: float = 0.0
    peers: list[str] = field(default_factory=list)
    rejected: int = 0  # parts of this round's wait that were rejected (logged as message_rejected)
    # Every member's sample ids of this round (attested: each sender's own list, carried by its parts).
    samples: dict[str, np.ndarray] = field(default_factory=dict)


EarlyKey = tuple[int, int, str, int, str]  # (epoch, round, phase, shard, src)

# How long a collective waits on its inbox before it looks again for a newer epoch (s). A new epoch
# arrives on the control inbox, not this one: at 0.2 s a survivor noticed its failover plan a median
# 0.13 s late at a 300 ms heartbeat timeout; a look costs a queue poll.
INTERRUPT_POLL_S = 0.02


class AllReduce:
    """One site's side of the collective. Parts are validated (`parse_coll_part`) before use;
    parts of the next round or of a later epoch wait in a bounded buffer (`early_max_parts`,
    `early_max_bytes`, of which one sender may fill `early_src_share`); beyond it, or from a
    sender that is no site (`sites`), or for a round further ahead, they are rejected and logged."""

    def __init__(self, node: WanNode, inbox: queue.Queue[Message], me: str, chunk_bytes: int, compression: str,
                 *, max_total: int = 1 << 31, attest: bool = False, max_samples: int = 1 << 16,
                 sample_id_limit: int = MAX_INT, early_max_bytes: int = 256 << 20,
                 early_max_parts: int = 8192, early_src_share: float = 0.5,
                 sites: frozenset[str] | None = None) -> None:
        if compression not in PAYLOAD_DTYPES:
            raise ValueError(f"unknown compression {compression!r}")
        self.node = node
        self.inbox = inbox
        self.me = me
        self.compression = compression
        self.part_elems = max(1, chunk_bytes // 4)  # float32 elements per message
        self.limits = CollLimits(compression=compression, part_elems=self.part_elems, max_total=max_total,
                                 attest=attest, max_samples=max_samples, sample_id_limit=sample_id_limit)
        # Parts that arrived before their round (or epoch) was asked for: key -> {offset: part}
        self._early: dict[EarlyKey, dict[int, CollPart]] = {}
        self.early_max_bytes = early_max_bytes
        self.early_max_parts = early_max_parts
        self.early_src_share = early_src_share
        self._early_bytes = 0
        self._early_parts = 0
        self._early_by_src: dict[str, list[int]] = {}  # src -> [parts, bytes]
        self.sites = sites  # who may take part in a collective (None: anyone the node accepts)
        self.epoch: int | None = None  # None: accept parts of any epoch (no membership changes)
        self.last_stats = RoundStats(round=-1)
        self.interrupted: Callable[[], bool] = lambda: False
        self.stall_timeout_s: float | None = None

    def set_compression(self, compression: str) -> None:
        """The epoch's payload encoding (a consistency setting per epoch may change it)."""
        if compression not in PAYLOAD_DTYPES:
            raise ValueError(f"unknown compression {compression!r}")
        self.compression = compression
        self.limits = replace(self.limits, compression=compression)

    def _limits_for(self, msg: Message) -> CollLimits:
        """The limits a part is checked against: this epoch's; a part of a LATER epoch (whose setting
        this site may not have heard yet) may use any payload encoding: it is held, and its values
        are still checked (shape, finiteness) like any other."""
        if self.epoch is None or msg.epoch <= self.epoch or not msg.buf_meta:
            return self.limits
        by_dtype = {v: k for k, v in PAYLOAD_DTYPES.items()}
        how = by_dtype.get(msg.buf_meta[0][0])
        return self.limits if how is None else replace(self.limits, compression=how)

    def reset(self, epoch: int) -> None:
        """A new membership epoch: parts of older epochs are void; parts of this or later ones wait."""
        self.epoch = epoch
        self._drop_early(lambda key: key[0] < epoch)

    # ------------------------------------------------------------------ the early buffer
    def _count(self, part: CollPart, sign: int) -> None:
        self._early_parts += sign
        self._early_bytes += sign * part.nbytes
        mine = self._early_by_src.setdefault(part.src, [0, 0])
        mine[0] += sign
        mine[1] += sign * part.nbytes

    def _drop_early(self, doomed: Callable[[EarlyKey], bool]) -> None:
        for key in [k for k in self._early if doomed(k)]:
            for part in self._early.pop(key).values():
                self._count(part, -1)

    def _hold(self, part: CollPart, epoch: int, msg: Message, stats: RoundStats) -> None:
        """Keep a part of a later round or epoch, within the bounds; reject it beyond them."""
        key = (epoch, part.round, part.phase, part.shard, part.src)
        slot = self._early.setdefault(key, {})
        old = slot.pop(part.offset, None)
        if old is not None:
            self._count(old, -1)
        src_parts, src_bytes = self._early_by_src.get(part.src, [0, 0])
        src_max_parts = int(self.early_max_parts * self.early_src_share)
        src_max_bytes = int(self.early_max_bytes * self.early_src_share)
        full = None
        if self._early_parts + 1 > self.early_max_parts or self._early_bytes + part.nbytes > self.early_max_bytes:
            full = (f"{self._early_parts} parts, {self._early_bytes} bytes held; limits {self.early_max_parts} parts, "
                    f"{self.early_max_bytes} bytes")
        elif src_parts + 1 > src_max_parts or src_bytes + part.nbytes > src_max_bytes:
            full = (f"{part.src!r} holds {src_parts} parts, {src_bytes} bytes; one sender may hold {src_max_parts} "
                    f"parts, {src_max_bytes} bytes")
        if full is not None:
            if not slot:
                del self._early[key]
            self._reject(msg, stats, "early_buffer_full",
                         f"part of round {part.round} (epoch {msg.epoch}) does not fit the buffer of early parts: {full}")
            return
        slot[part.offset] = part
        self._count(part, +1)

    def _take_early(self, epoch: int, rnd: int, phase: str) -> list[CollPart]:
        out: list[CollPart] = []
        for key in [k for k in self._early if k[:3] == (epoch, rnd, phase)]:
            for part in self._early.pop(key).values():
                self._count(part, -1)
                out.append(part)
        return out

    def early_held(self) -> tuple[int, int]:
        """(parts, bytes) waiting in the early buffer."""
        return self._early_parts, self._early_bytes

    def _reject(self, msg: Message, stats: RoundStats, reason: str, detail: str) -> None:
        stats.rejected += 1
        self.node.log.emit("message_rejected", kind=msg.kind, src=msg.src, msg_epoch=msg.epoch, reason=reason,
                           detail=detail, waiting_round=stats.round)

    # ------------------------------------------------------------------ sending
    def _send_shard(self, dest: str, values: np.ndarray, rnd: int, phase: str, shard: int, stats: RoundStats,
                    samples: np.ndarray | None = None) -> None:
        total = values.size
        for off in range(0, max(total, 1), self.part_elems):
            part = values[off:off + self.part_elems]
            payload, scale = compress(part, self.compression)
            arrays = [payload] if samples is None or off > 0 else [payload, samples]
            self.node.send(dest, "coll", TrafficClass.COLLECTIVE.value,
                           {"round": rnd, "phase": phase, "shard": shard, "offset": off, "total": total,
                            "scale": scale}, arrays)
            stats.payload_bytes_sent += payload.nbytes
            stats.messages_sent += 1

    def allreduce_mean(self, flat: np.ndarray, rnd: int, members: Sequence[str], timeout_s: float,
                       samples: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, RoundStats]:
        """Mean over `members` of each member's `flat` [P] float32; blocks until done or raises.

        `samples`: this site's sample ids of the round; they travel with its first reduce-scatter
        part to every member, and `stats.samples` holds every member's ids once the round is done
        (required when the reducer attests, i.e. was built with attest=True).
        """
        members = sorted(members)
        n = len(members)
        me = members.index(self.me)
        stats = RoundStats(round=rnd, peers=[m for m in members if m != self.me])
        self.last_stats = stats
        ids = None if samples is None else np.ascontiguousarray(samples, dtype=np.int64).reshape(-1)
        if self.limits.attest and ids is None:
            raise ValueError("this reducer attests samples: allreduce_mean needs this site's sample ids")
        if ids is not None:
            stats.samples[self.me] = ids.copy()
        cur = self.epoch if self.epoch is not None else 0
        self._drop_early(lambda key: key[0] == cur and key[1] < rnd)  # rounds that are over
        if n == 1:
            return roundtrip(flat, self.compression, self.part_elems).copy(), stats
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)  # shard k = [bounds[k], bounds[k+1])
        shard = lambda k: flat[bounds[k]:bounds[k + 1]]  # noqa: E731
        deadline = time.monotonic() + timeout_s

        # Phase 1: reduce-scatter. Send every other member its shard of my vector (and my ids).
        for k, m in enumerate(members):
            if k != me:
                self._send_shard(m, shard(k), rnd, "rs", k, stats, ids)
        mine = {self.me: roundtrip(shard(me), self.compression, self.part_elems)}
        size = int(bounds[me + 1] - bounds[me])
        t0 = time.monotonic()
        got = self._gather(rnd, "rs", {(me, m): size for m in members if m != self.me}, deadline, stats)
        mine.update({src: v for (_k, src), v in got.items()})
        reduced = reduce_in_order([mine[m] for m in members])

        # Phase 2: all-gather. Every member receives my reduced shard.
        for k, m in enumerate(members):
            if k != me:
                self._send_shard(m, reduced, rnd, "ag", me, stats)
        out = np.empty_like(flat, dtype=np.float32)
        out[bounds[me]:bounds[me + 1]] = roundtrip(reduced, self.compression, self.part_elems)
        sizes = {(k, m): int(bounds[k + 1] - bounds[k]) for k, m in enumerate(members) if k != me}
        for (k, _src), v in self._gather(rnd, "ag", sizes, deadline, stats).items():
            out[bounds[k]:bounds[k + 1]] = v
        stats.wait_s = time.monotonic() - t0
        return out, stats

    # ------------------------------------------------------------------ receiving
    def _parse(self, msg: Message, stats: RoundStats) -> CollPart | None:
        try:
            return parse_coll_part(msg, self._limits_for(msg))
        except Rejected as e:
            self._reject(msg, stats, e.reason, e.detail)
            return None

    def _gather(self, rnd: int, phase: str, sizes: dict[tuple[int, str], int], deadline: float,
                stats: RoundStats) -> dict[tuple[int, str], np.ndarray]:
        """Wait until every (shard, src) in sizes has delivered all of its values (and, in the
        reduce-scatter of an attesting reducer, its sample ids)."""
        cur = self.epoch if self.epoch is not None else 0
        bufs = {key: np.empty(n, dtype=np.float32) for key, n in sizes.items()}
        offsets: dict[tuple[int, str], set[int]] = {key: set() for key in sizes}
        filled = {key: 0 for key in sizes}
        last_progress = {src: time.monotonic() for (_k, src) in sizes}

        def place(part: CollPart, msg: Message | None) -> None:
            key = (part.shard, part.src)
            if part.total != sizes[key]:
                if msg is not None:
                    self._reject(msg, stats, "wrong_total", f"round {rnd} phase {phase} shard {part.shard}: "
                                                            f"total {part.total}, the shard has {sizes[key]} values")
                return
            if part.offset in offsets[key]:
                return  # a second copy of a part already placed
            bufs[key][part.offset:part.offset + part.values.size] = part.values
            offsets[key].add(part.offset)
            filled[key] += part.values.size
            last_progress[part.src] = time.monotonic()
            if part.samples is not None:
                stats.samples[part.src] = part.samples

        # Parts that arrived early, before this phase began (checked for their totals now).
        for part in self._take_early(cur, rnd, phase):
            if (part.shard, part.src) in sizes and part.total == sizes[(part.shard, part.src)]:
                place(part, None)
        done = lambda key: 0 in offsets[key] and filled[key] == sizes[key]  # noqa: E731
        while not all(done(key) for key in sizes):
            msg = self._next(rnd, phase, sizes, done, last_progress, deadline)
            if msg is None:
                continue
            part = self._parse(msg, stats)
            if part is not None:
                self._dispatch(part, msg, rnd, phase, sizes, place, stats)
        return bufs

    def _dispatch(self, part: CollPart, msg: Message, rnd: int, phase: str, sizes: dict[tuple[int, str], int],
                  place: Callable[[CollPart, Message], None], stats: RoundStats) -> None:
        """Place a valid part, hold it for later, or reject it (each with its reason)."""
        cur = self.epoch if self.epoch is not None else 0
        ep = part.epoch if self.epoch is not None else 0
        senders = {src for (_k, src) in sizes}
        if self.sites is not None and part.src not in self.sites:
            self._reject(msg, stats, "not_a_site", f"{part.src!r} is not a site of this cluster {sorted(self.sites)}")
        elif ep < cur:
            pass  # a part of an older epoch's round: void
        elif ep > cur:
            self._hold(part, ep, msg, stats)  # a later epoch: its members are not known yet
        elif part.src not in senders:
            self._reject(msg, stats, "not_a_member", f"round {rnd}: {part.src!r} is not among this round's senders "
                                                     f"{sorted(senders)} (epoch {cur})")
        elif part.round > rnd + 1:
            self._reject(msg, stats, "too_far_ahead", f"part of round {part.round} while round {rnd} is in flight "
                                                      f"(a peer can be at most one round ahead)")
        elif part.round > rnd or (part.round == rnd and part.phase == "ag" and phase == "rs"):
            self._hold(part, ep, msg, stats)
        elif part.round == rnd and part.phase == phase:
            if (part.shard, part.src) in sizes:
                place(part, msg)
            else:
                self._reject(msg, stats, "unexpected_part", f"round {rnd} phase {phase}: shard {part.shard} "
                                                            f"from {part.src!r} is not one this site waits for")
        # else: a part of an older round (already complete or aborted): drop it.

    def _next(self, rnd: int, phase: str, sizes: dict[tuple[int, str], int], done: Callable[[tuple[int, str]], bool],
              last_progress: dict[str, float], deadline: float) -> Message | None:
        """The next message off the inbox (None after a short wait); raises on deadline, stall or interruption."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted(src for (k, src) in sizes if not done((k, src)))
            raise CollectiveAborted(f"round {rnd} phase {phase}: no data from {missing} before the deadline")
        self.node.check()
        if self.interrupted():
            raise CollectiveInterrupted(f"round {rnd} phase {phase}: a newer membership epoch arrived")
        if self.stall_timeout_s is not None:
            now = time.monotonic()
            stalled = sorted(src for (k, src) in sizes
                             if not done((k, src)) and now - last_progress[src] > self.stall_timeout_s)
            if stalled:
                raise PeerUnreachable(stalled[0], f"round {rnd} phase {phase}: nothing from {stalled} for "
                                                  f"{self.stall_timeout_s:.1f} s")
        try:
            return self.inbox.get(timeout=min(remaining, INTERRUPT_POLL_S))
        except queue.Empty:
            return None
