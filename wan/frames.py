"""Wire format of every xdc message: a msgpack header frame plus raw buffer frames.

A message is one ZeroMQ multipart message:
    frame 0: msgpack map (the header): protocol version, run id, epoch, step, source,
             source incarnation, kind, traffic class, sequence number, a body map, and a
             description (dtype, shape) of each following buffer frame;
    frames 1..k: raw bytes of tensors (sent zero-copy from contiguous CPU tensors).
No pickle anywhere: headers are msgpack with `raw=False, strict_map_key=True`, buffers are
reinterpreted only as the dtypes in `ALLOWED_DTYPES`.

`decode` validates everything it can see without knowing the cluster (sizes, types,
buffer descriptions); `check_fence` then applies the cluster's membership (run id, epoch,
member). Both return precise reasons so a rejected frame is logged with why.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

PROTOCOL_VERSION = 1


class TrafficClass(str, enum.Enum):
    """The six classes; every inter-process byte is counted in exactly one of them."""

    COLLECTIVE = "collective"
    ABORTED_COLLECTIVE = "aborted_collective"  # assigned afterwards to rounds that did not commit
    STATE_TRANSFER = "state_transfer"
    CHECKPOINT = "checkpoint"
    CONTROL = "control"
    TELEMETRY = "telemetry"


TRAFFIC_CLASSES: tuple[str, ...] = tuple(c.value for c in TrafficClass)

ALLOWED_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),  # carried as raw 16-bit words
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "int64": np.dtype("<i8"),
}


class FrameError(ValueError):
    """A frame that cannot be accepted; `reason` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class Message:
    """A decoded message. `bufs` are zero-copy memoryviews into the received frames."""

    kind: str
    cls: str
    run: str
    epoch: int
    step: int
    src: str
    inc: int  # source incarnation: random per process start, so a restarted peer's seq restart is not a duplicate
    seq: int  # per (src, inc, destination) sequence number; 0 = unreliable (no ack expected)
    body: dict[str, Any] = field(default_factory=dict)
    bufs: list[memoryview] = field(default_factory=list)
    buf_meta: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    wire_bytes: int = 0  # sum of frame payload sizes as received

    def array(self, i: int) -> np.ndarray:
        """Buffer i as a read-only numpy array of its declared dtype and shape (no copy)."""
        dtype, shape = self.buf_meta[i]
        return np.frombuffer(self.bufs[i], dtype=ALLOWED_DTYPES[dtype]).reshape(shape)


def encode(
    *,
    kind: str,
    cls: str,
    run: str,
    epoch: int,
    step: int,
    src: str,
    inc: int,
    seq: int,
    body: dict[str, Any] | None = None,
    arrays: Sequence[np.ndarray] = (),
) -> list[Any]:
    """Build the frames of one message. Arrays must be C-contiguous; they are not copied."""
    if cls not in TRAFFIC_CLASSES:
        raise ValueError(f"unknown traffic class {cls!r}")
    meta = []
    frames: list[Any] = []
    for a in arrays:
        name = _dtype_name(a.dtype)
        if not a.flags.c_contiguous:
            raise ValueError("arrays must be C-contiguous to be sent zero-copy")
        meta.append([name, list(a.shape)])
        frames.append(memoryview(a.reshape(-1)).cast("B"))  # reshape: empty N-d arrays cannot be cast
    header = {
        "v": PROTOCOL_VERSION,
        "run": run,
        "epoch": int(epoch),
        "step": int(step),
        "src": src,
        "inc": int(inc),
        "kind": kind,
        "cls": cls,
        "seq": int(seq),
        "body": body or {},
        "bufs": meta,
    }
    return [msgpack.packb(header, use_bin_type=True), *frames]


def _dtype_name(dt: np.dtype) -> str:
    for name, allowed in ALLOWED_DTYPES.items():
        if name != "bfloat16" and np.dtype(dt) == allowed:
            return name
    raise ValueError(f"dtype {dt} cannot be sent")


_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "run": str,
    "epoch": int,
    "step": int,
    "src": str,
    "inc": int,
    "kind": str,
    "cls": str,
    "seq": int,
    "body": dict,
    "bufs": list,
}


def decode(frames: Sequence[Any], *, max_frame_bytes: int, max_header_bytes: int) -> Message:
    """Parse and validate one multipart message; raise FrameError with a precise reason."""
    if not frames:
        raise FrameError("empty", "message has no frames")
    sizes = [len(_buffer(f)) for f in frames]
    total = sum(sizes)
    if sizes[0] > max_header_bytes:
        raise FrameError("header_too_large", f"header is {sizes[0]} bytes, limit {max_header_bytes}")
    if total > max_frame_bytes:
        raise FrameError("too_large", f"message is {total} bytes, limit {max_frame_bytes}")
    try:
        header = msgpack.unpackb(_buffer(frames[0]), raw=False, strict_map_key=True, max_bin_len=0,
                                 max_ext_len=0, ext_hook=_no_ext)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise FrameError("malformed_header", f"header is not valid msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(header, dict):
        raise FrameError("malformed_header", f"header is a {type(header).__name__}, expected a map")
    for key, tp in _REQUIRED.items():
        if key not in header:
            raise FrameError("malformed_header", f"header lacks field {key!r}")
        if not isinstance(header[key], tp) or (tp is int and isinstance(header[key], bool)):
            raise FrameError("malformed_header", f"header field {key!r} has type {type(header[key]).__name__}")
    if header["v"] != PROTOCOL_VERSION:
        raise FrameError("bad_version", f"protocol version {header['v']}, expected {PROTOCOL_VERSION}")
    if header["cls"] not in TRAFFIC_CLASSES:
        raise FrameError("bad_class", f"unknown traffic class {header['cls']!r}")
    meta = header["bufs"]
    if len(meta) != len(frames) - 1:
        raise FrameError("buffer_count", f"header describes {len(meta)} buffers, message has {len(frames) - 1}")
    buf_meta: list[tuple[str, tuple[int, ...]]] = []
    for i, m in enumerate(meta):
        if (not isinstance(m, list) or len(m) != 2 or not isinstance(m[0], str) or m[0] not in ALLOWED_DTYPES
                or not isinstance(m[1], list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in m[1])):
            raise FrameError("bad_buffer_meta", f"buffer {i} description {m!r} is not [dtype, shape]")
        n = ALLOWED_DTYPES[m[0]].itemsize * math.prod(m[1])  # exact integers: no int64 wrap-around
        if n != sizes[i + 1]:
            raise FrameError("buffer_size", f"buffer {i} is {sizes[i + 1]} bytes, its description says {n}")
        buf_meta.append((m[0], tuple(m[1])))
    return Message(
        kind=header["kind"], cls=header["cls"], run=header["run"], epoch=header["epoch"], step=header["step"],
        src=header["src"], inc=header["inc"], seq=header["seq"], body=header["body"],
        bufs=[_buffer(f) for f in frames[1:]], buf_meta=buf_meta, wire_bytes=total,
    )


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed in a header")


def _buffer(frame: Any) -> memoryview:
    if isinstance(frame, (bytes, bytearray, memoryview)):
        return memoryview(frame)
    return frame.buffer  # zmq.Frame


@dataclass(frozen=True)
class Fence:
    """What a receiver accepts: its run, the lowest epoch still current, the known members."""

    run_id: str
    epoch: int
    members: frozenset[str]


# Kinds accepted whatever their epoch: a process asking for an epoch (join), transport acks, and
# heartbeats, which carry the sender's epoch in their body so the coordinator can tell a
# removed-but-alive member to rejoin instead of silently dropping its liveness.
UNFENCED_KINDS = frozenset({"join", "ack", "heartbeat"})


def check_fence(msg: Message, fence: Fence) -> tuple[bool, str]:
    """Pure fencing rule: (accepted, reason). Stale epochs, unknown members, wrong runs are rejected."""
    if msg.run != fence.run_id:
        return False, f"wrong_run: message run {msg.run!r}, this run is {fence.run_id!r}"
    if msg.src not in fence.members:
        return False, f"unknown_member: {msg.src!r} is not in {sorted(fence.members)}"
    if msg.kind in UNFENCED_KINDS:
        return True, "unfenced kind"
    if msg.epoch < fence.epoch:
        return False, f"stale_epoch: message epoch {msg.epoch} < current epoch {fence.epoch}"
    return True, "ok"


def wire_overhead(frame_sizes: Sequence[int], curve: bool) -> int:
    """Bytes ZeroMQ adds on the wire to frames of these sizes (ZMTP 3 header; CURVE box per frame).

    ZMTP: 1 flag byte + 1 size byte for a body of at most 255 bytes, else 1 + 8. With CURVE
    every frame travels as an encrypted MESSAGE command: 16 bytes of command name and nonce,
    1 flag byte and a 16-byte MAC around the frame (33 bytes), inside a ZMTP command frame.
    """
    total = 0
    for n in frame_sizes:
        body = n + 33 if curve else n
        total += body + (2 if body <= 255 else 9) - n
    return total
