"""Peer state transfer: a healthy member sends its training state to a rejoining site.

The state (model parameters, inner AdamW state, DiLoCo outer state) is packed into one
safetensors blob (no pickle), cut into `state_chunk` messages of traffic class
`state_transfer`, and re-assembled by the joiner, which checks the blob's sha256 and, after
loading, the parameter hash the donor announced. Anything that does not match is refused,
so a joiner never trains from a state it could not verify. Chunks are parsed before use
(`site_agent.messages.parse_state_chunk`): a bad one is rejected with its reason, never trusted
with a length to allocate.
"""

from __future__ import annotations

import hashlib
import queue
import time
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from site_agent.messages import Rejected, StateChunk, parse_state_chunk
from wan.frames import Message, TrafficClass
from wan.node import WanNode

STATE = TrafficClass.STATE_TRANSFER.value


class StateTransferError(RuntimeError):
    pass


def pack_state(blobs: dict[str, dict[str, torch.Tensor]]) -> bytes:
    flat = {f"{group}/{name}": t.contiguous() for group, tensors in blobs.items() for name, t in tensors.items()}
    return st_save(flat)


def unpack_state(data: bytes) -> dict[str, dict[str, torch.Tensor]]:
    """The tensor groups of a packed state; ValueError (never anything else) if it is not one."""
    try:
        flat = st_load(data)
    except Exception as e:  # safetensors raises its own error type on a bad header or bad offsets
        raise ValueError(f"state is not a valid safetensors blob: {type(e).__name__}: {str(e)[:200]}") from None
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        group, sep, name = key.partition("/")
        if not sep or not group or not name:
            raise ValueError(f"state tensor name {key[:80]!r} is not '<group>/<name>'")
        out.setdefault(group, {})[name] = t
    return out


def send_state(node: WanNode, dest: str, data: bytes, meta: dict[str, Any], chunk_bytes: int, epoch: int) -> int:
    """Queue the whole state for `dest`; returns the number of payload bytes."""
    sha = hashlib.sha256(data).hexdigest()
    view = np.frombuffer(data, dtype=np.uint8)
    total = view.size
    for off in range(0, max(total, 1), chunk_bytes):
        node.send(dest, "state_chunk", STATE, {**meta, "sha256": sha, "offset": off, "total": total},
                  [view[off:off + chunk_bytes]], epoch=epoch)
    return total


def receive_state(inbox: queue.Queue[Message], donor: str, epoch: int, timeout_s: float,
                  interrupted: Callable[[], bool] = lambda: False, max_total: int = 1 << 34,
                  reject: Callable[[Message, Rejected], None] | None = None) -> tuple[bytes, dict[str, Any]]:
    """Assemble the state sent by `donor` in `epoch`; raise StateTransferError on timeout or a bad hash.

    Every chunk is parsed first (`parse_state_chunk`: a total of at most `max_total` bytes, an
    offset inside it, a byte buffer); a chunk that does not fit, or disagrees with the first
    chunk on the total, hashes or round, is passed to `reject` (logged) and ignored.
    """
    deadline = time.monotonic() + timeout_s
    buf: np.ndarray | None = None
    first: StateChunk | None = None
    seen: set[int] = set()
    got = 0
    while buf is None or got < buf.size:
        if interrupted():
            raise StateTransferError("interrupted by a newer membership epoch")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise StateTransferError(f"no complete state from {donor} within {timeout_s:.0f} s ({got} bytes)")
        try:
            msg = inbox.get(timeout=min(remaining, 0.2))
        except queue.Empty:
            continue
        if msg.src != donor or msg.epoch != epoch:
            continue  # a transfer of an older epoch: ignore
        try:
            c = parse_state_chunk(msg, max_total)
            if first is not None and (c.total, c.sha256, c.params_hash, c.round, c.samples_sha256) != (
                    first.total, first.sha256, first.params_hash, first.round, first.samples_sha256):
                raise Rejected("inconsistent_chunk", f"chunk at offset {c.offset} announces total {c.total}, "
                                                     f"sha256 {c.sha256[:12]}, round {c.round}; the first chunk "
                                                     f"announced {first.total}, {first.sha256[:12]}, {first.round}")
        except Rejected as e:
            if reject is not None:
                reject(msg, e)
            continue
        if first is None:
            first, buf = c, np.empty(c.total, dtype=np.uint8)
        if c.offset in seen:
            continue
        seen.add(c.offset)
        buf[c.offset:c.offset + c.data.size] = c.data
        got += c.data.size
    assert first is not None
    data = buf.tobytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != first.sha256:
        raise StateTransferError(f"state from {donor}: sha256 {actual} != announced {first.sha256}")
    meta = {"round": first.round, "params_hash": first.params_hash, "sha256": first.sha256,
            "samples_sha256": first.samples_sha256}
    return data, meta
