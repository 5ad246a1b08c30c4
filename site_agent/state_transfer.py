"""Peer state transfer: a healthy member sends its training state to a rejoining site.

The state (model parameters, inner AdamW state, DiLoCo outer state) is packed into one
safetensors blob (no pickle), cut into `state_chunk` messages of traffic class
`state_transfer`, and re-assembled by the joiner, which checks the blob's sha256 and, after
loading, the parameter hash the donor announced. Anything that does not match is refused,
so a joiner never trains from a state it could not verify.
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

from wan.frames import Message, TrafficClass
from wan.node import WanNode

STATE = TrafficClass.STATE_TRANSFER.value


class StateTransferError(RuntimeError):
    pass


def pack_state(blobs: dict[str, dict[str, torch.Tensor]]) -> bytes:
    flat = {f"{group}/{name}": t.contiguous() for group, tensors in blobs.items() for name, t in tensors.items()}
    return st_save(flat)


def unpack_state(data: bytes) -> dict[str, dict[str, torch.Tensor]]:
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in st_load(data).items():
        group, name = key.split("/", 1)
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
                  interrupted: Callable[[], bool] = lambda: False) -> tuple[bytes, dict[str, Any]]:
    """Assemble the state sent by `donor` in `epoch`; raise StateTransferError on timeout or a bad hash."""
    deadline = time.monotonic() + timeout_s
    buf: np.ndarray | None = None
    got = 0
    meta: dict[str, Any] = {}
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
        b = msg.body
        if buf is None:
            buf = np.empty(int(b["total"]), dtype=np.uint8)
            meta = {k: v for k, v in b.items() if k not in ("offset", "total")}
        part = msg.array(0)
        off = int(b["offset"])
        buf[off:off + part.size] = part
        got += part.size
    data = buf.tobytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != meta["sha256"]:
        raise StateTransferError(f"state from {donor}: sha256 {actual} != announced {meta['sha256']}")
    return data, meta
