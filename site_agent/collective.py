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
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

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


class AllReduce:
    def __init__(self, node: WanNode, inbox: queue.Queue[Message], me: str, chunk_bytes: int, compression: str) -> None:
        self.node = node
        self.inbox = inbox
        self.me = me
        self.compression = compression
        self.part_elems = max(1, chunk_bytes // 4)  # float32 elements per message
        # Parts that arrived before their round was asked for: (round, phase, shard, src) -> {offset: values}
        self._early: dict[tuple[int, str, int, str], dict[int, np.ndarray]] = {}
        self.epoch: int | None = None  # None: accept parts of any epoch (no membership changes)
        self.last_stats = RoundStats(round=-1)
        self.interrupted: Callable[[], bool] = lambda: False
        self.stall_timeout_s: float | None = None

    def reset(self, epoch: int) -> None:
        """A new membership epoch: parts of older epochs are void."""
        self.epoch = epoch
        self._early.clear()

    def _send_shard(self, dest: str, values: np.ndarray, rnd: int, phase: str, shard: int, stats: RoundStats) -> None:
        total = values.size
        for off in range(0, max(total, 1), self.part_elems):
            part = values[off:off + self.part_elems]
            payload, scale = compress(part, self.compression)
            self.node.send(dest, "coll", TrafficClass.COLLECTIVE.value,
                           {"round": rnd, "phase": phase, "shard": shard, "offset": off, "total": total,
                            "scale": scale}, [payload])
            stats.payload_bytes_sent += payload.nbytes
            stats.messages_sent += 1

    def allreduce_mean(self, flat: np.ndarray, rnd: int, members: Sequence[str], timeout_s: float) -> tuple[np.ndarray, RoundStats]:
        """Mean over `members` of each member's `flat` [P] float32; blocks until done or raises."""
        members = sorted(members)
        n = len(members)
        me = members.index(self.me)
        stats = RoundStats(round=rnd, peers=[m for m in members if m != self.me])
        self.last_stats = stats
        if n == 1:
            return roundtrip(flat, self.compression, self.part_elems).copy(), stats
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)  # shard k = [bounds[k], bounds[k+1])
        shard = lambda k: flat[bounds[k]:bounds[k + 1]]  # noqa: E731
        deadline = time.monotonic() + timeout_s

        # Phase 1: reduce-scatter. Send every other member its shard of my vector.
        for k, m in enumerate(members):
            if k != me:
                self._send_shard(m, shard(k), rnd, "rs", k, stats)
        mine = {self.me: roundtrip(shard(me), self.compression, self.part_elems)}
        size = int(bounds[me + 1] - bounds[me])
        t0 = time.monotonic()
        got = self._collect(rnd, "rs", {(me, m) for m in members if m != self.me}, size, deadline)
        mine.update({src: v for (_k, src), v in got.items()})
        reduced = reduce_in_order([mine[m] for m in members])

        # Phase 2: all-gather. Every member receives my reduced shard.
        for k, m in enumerate(members):
            if k != me:
                self._send_shard(m, reduced, rnd, "ag", me, stats)
        out = np.empty_like(flat, dtype=np.float32)
        out[bounds[me]:bounds[me + 1]] = roundtrip(reduced, self.compression, self.part_elems)
        want = {(k, m) for k, m in enumerate(members) if k != me}
        for (k, _src), v in self._collect_sized(rnd, "ag", want, bounds, deadline).items():
            out[bounds[k]:bounds[k + 1]] = v
        stats.wait_s = time.monotonic() - t0
        return out, stats

    def _collect_sized(self, rnd: int, phase: str, want: set[tuple[int, str]], bounds: np.ndarray,
                       deadline: float) -> dict[tuple[int, str], np.ndarray]:
        sizes = {key: int(bounds[key[0] + 1] - bounds[key[0]]) for key in want}
        return self._gather(rnd, phase, sizes, deadline)

    def _collect(self, rnd: int, phase: str, want: set[tuple[int, str]], size: int,
                 deadline: float) -> dict[tuple[int, str], np.ndarray]:
        return self._gather(rnd, phase, {key: size for key in want}, deadline)

    def _gather(self, rnd: int, phase: str, sizes: dict[tuple[int, str], int],
                deadline: float) -> dict[tuple[int, str], np.ndarray]:
        """Wait until every (shard, src) in sizes has delivered all of its values."""
        bufs = {key: np.empty(n, dtype=np.float32) for key, n in sizes.items()}
        filled = {key: 0 for key in sizes}
        last_progress = {src: time.monotonic() for (_k, src) in sizes}

        def place(k: int, src: str, off: int, vals: np.ndarray) -> None:
            key = (k, src)
            bufs[key][off:off + vals.size] = vals
            filled[key] += vals.size
            last_progress[src] = time.monotonic()

        # Parts that arrived early, before this phase began.
        for (r, ph, k, src), parts in list(self._early.items()):
            if r == rnd and ph == phase and (k, src) in sizes:
                for off, vals in parts.items():
                    place(k, src, off, vals)
                del self._early[(r, ph, k, src)]
        while any(filled[key] < sizes[key] for key in sizes):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(src for (k, src), n in sizes.items() if filled[(k, src)] < n)
                raise CollectiveAborted(f"round {rnd} phase {phase}: no data from {missing} before the deadline")
            self.node.check()
            if self.interrupted():
                raise CollectiveInterrupted(f"round {rnd} phase {phase}: a newer membership epoch arrived")
            if self.stall_timeout_s is not None:
                now = time.monotonic()
                stalled = sorted(src for (k, src), n in sizes.items()
                                 if filled[(k, src)] < n and now - last_progress[src] > self.stall_timeout_s)
                if stalled:
                    raise PeerUnreachable(stalled[0], f"round {rnd} phase {phase}: nothing from {stalled} for "
                                                      f"{self.stall_timeout_s:.1f} s")
            try:
                msg = self.inbox.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            if self.epoch is not None and msg.epoch != self.epoch:
                continue  # a part of an older epoch's round: void
            b = msg.body
            try:
                r, ph, k, off = int(b["round"]), str(b["phase"]), int(b["shard"]), int(b["offset"])
                vals = decompress(msg.array(0), float(b["scale"]))
            except (KeyError, TypeError, ValueError, IndexError) as e:
                self.node.log.emit("frame_rejected", reason="bad_collective_body", detail=str(e), peer=msg.src)
                continue
            if r == rnd and ph == phase and (k, msg.src) in sizes:
                place(k, msg.src, off, vals)
            elif r > rnd or (r == rnd and ph == "ag" and phase == "rs"):
                self._early.setdefault((r, ph, k, msg.src), {})[off] = vals.copy()
            # else: a part of an older round (already complete or aborted): drop it.
        return bufs
