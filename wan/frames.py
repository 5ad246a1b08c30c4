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

Decoding is bounded in time and memory before any field is trusted, whatever the bytes:
the header is at most `max_header_bytes` and msgpack's own limits stop a length prefix from
allocating more than the header holds; the decoded header is then walked once, iteratively,
and refused if it nests deeper than `MAX_DEPTH` or holds anything but maps with string
keys, lists, strings, 64-bit integers, floats, booleans and nil. Names are at most
`MAX_NAME_CHARS`, integers of the envelope lie in 64-bit ranges, a message describes at most
`MAX_BUFFERS` buffers of at most `MAX_DIMS` dimensions, each dimension at most the message
limit, so the size a description implies is a small exact integer compared with the
buffer's real length. `decode` raises only `FrameError`, and every detail it formats goes
through `safe_repr`, which is bounded and never raises.
"""

from __future__ import annotations

import enum
import reprlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

MAX_DEPTH = 16  # maps/lists nested in a header, the body included
MAX_BUFFERS = 64  # buffer frames one message may carry
MAX_DIMS = 16  # dimensions of one buffer's shape
MAX_NAME_CHARS = 128  # run id, source, kind
MAX_DETAIL_CHARS = 400  # a rejection's detail, as logged
_I64 = 1 << 63


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
        detail = detail if len(detail) <= MAX_DETAIL_CHARS else detail[:MAX_DETAIL_CHARS] + "..."
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

    def __repr__(self) -> str:
        return (f"Message(kind={safe_repr(self.kind)}, cls={safe_repr(self.cls)}, src={safe_repr(self.src)}, "
                f"epoch={safe_repr(self.epoch)}, step={safe_repr(self.step)}, seq={safe_repr(self.seq)}, "
                f"body={safe_repr(self.body)}, bufs={safe_repr(self.buf_meta)})")

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


def undeliverable(frames: Sequence[Any], *, max_frame_bytes: int, max_header_bytes: int) -> str | None:
    """Why a receiver with these limits would refuse the encoded message `frames` before reading its
    header (`decode`'s size checks, same reasons), or None: a sender checks before it sends, since a
    refused frame is never acked and would be resent for ever."""
    try:
        _sized_views(frames, max_frame_bytes=max_frame_bytes, max_header_bytes=max_header_bytes)
    except FrameError as e:
        return str(e)
    return None


def _sized_views(frames: Sequence[Any], *, max_frame_bytes: int, max_header_bytes: int) -> list[memoryview]:
    """The frames as byte views, once their count and sizes are within the limits (else FrameError)."""
    if not frames:
        raise FrameError("empty", "message has no frames")
    if len(frames) > MAX_BUFFERS + 1:
        raise FrameError("buffer_count", f"message has {len(frames) - 1} buffer frames, limit {MAX_BUFFERS}")
    views = [_buffer(f) for f in frames]
    sizes = [v.nbytes for v in views]
    if sizes[0] > max_header_bytes:
        raise FrameError("header_too_large", f"header is {sizes[0]} bytes, limit {max_header_bytes}")
    if sum(sizes) > max_frame_bytes:
        raise FrameError("too_large", f"message is {sum(sizes)} bytes, limit {max_frame_bytes}")
    return views


def decode(frames: Sequence[Any], *, max_frame_bytes: int, max_header_bytes: int) -> Message:
    """Parse and validate one multipart message; raise FrameError (and nothing else) with a precise reason."""
    views = _sized_views(frames, max_frame_bytes=max_frame_bytes, max_header_bytes=max_header_bytes)
    sizes = [v.nbytes for v in views]
    total = sum(sizes)
    header = _unpack_header(views[0])
    _check_envelope(header)
    meta = header["bufs"]
    if len(meta) != len(frames) - 1:
        raise FrameError("buffer_count", f"header describes {len(meta)} buffers, message has {len(frames) - 1}")
    buf_meta = [_buffer_meta(i, m, sizes[i + 1], max_frame_bytes) for i, m in enumerate(meta)]
    return Message(
        kind=header["kind"], cls=header["cls"], run=header["run"], epoch=header["epoch"], step=header["step"],
        src=header["src"], inc=header["inc"], seq=header["seq"], body=header["body"],
        bufs=views[1:], buf_meta=buf_meta, wire_bytes=total,
    )


def _unpack_header(view: memoryview) -> dict[str, Any]:
    """msgpack -> a map of plain values, bounded: no bin, no ext, depth <= MAX_DEPTH."""
    try:
        header = msgpack.unpackb(view, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0,
                                 ext_hook=_no_ext, timestamp=0)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise FrameError("malformed_header", f"header is not valid msgpack ({type(e).__name__}: {safe_repr(e)})") from None
    if not isinstance(header, dict):
        raise FrameError("malformed_header", f"header is a {type(header).__name__}, expected a map")
    _check_tree(header)
    return header


_SCALARS = (str, int, float, bool, type(None))


def _check_tree(root: Any) -> None:
    """Walk the decoded header without recursion; refuse deep nesting and foreign types."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > MAX_DEPTH:
                raise FrameError("malformed_header", f"header nests deeper than {MAX_DEPTH} levels")
            if isinstance(node, dict):
                for k, v in node.items():
                    if not isinstance(k, str):
                        raise FrameError("malformed_header", f"header has a map key of type {type(k).__name__}")
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in node)
        elif not isinstance(node, _SCALARS):
            raise FrameError("malformed_header", f"header holds a value of type {type(node).__name__}")


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
# Inclusive lower, exclusive upper bound of each integer field.
_INT_RANGE: dict[str, tuple[int, int]] = {
    "epoch": (0, _I64), "step": (-_I64, _I64), "inc": (0, _I64), "seq": (0, _I64),
}


def _check_envelope(header: dict[str, Any]) -> None:
    for key, tp in _REQUIRED.items():
        if key not in header:
            raise FrameError("malformed_header", f"header lacks field {key!r}")
        value = header[key]
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise FrameError("malformed_header", f"header field {key!r} has type {type(value).__name__}")
        if tp is str and len(value) > MAX_NAME_CHARS:
            raise FrameError("malformed_header", f"header field {key!r} is {len(value)} characters, "
                                                 f"limit {MAX_NAME_CHARS}")
        lo_hi = _INT_RANGE.get(key)
        if lo_hi is not None and not lo_hi[0] <= value < lo_hi[1]:
            raise FrameError("malformed_header", f"header field {key!r} = {value} is outside [{lo_hi[0]}, {lo_hi[1]})")
    if header["v"] != PROTOCOL_VERSION:
        raise FrameError("bad_version", f"protocol version {safe_repr(header['v'])}, expected {PROTOCOL_VERSION}")
    if header["cls"] not in TRAFFIC_CLASSES:
        raise FrameError("bad_class", f"unknown traffic class {safe_repr(header['cls'])}")
    if len(header["bufs"]) > MAX_BUFFERS:
        raise FrameError("buffer_count", f"header describes {len(header['bufs'])} buffers, limit {MAX_BUFFERS}")


def _buffer_meta(i: int, m: Any, size: int, max_bytes: int) -> tuple[str, tuple[int, ...]]:
    """Validate one [dtype, shape] against the buffer's real length `size`."""
    if (not isinstance(m, list) or len(m) != 2 or not isinstance(m[0], str) or m[0] not in ALLOWED_DTYPES
            or not isinstance(m[1], list)):
        raise FrameError("bad_buffer_meta", f"buffer {i} description {safe_repr(m)} is not [dtype, shape]")
    shape = m[1]
    if len(shape) > MAX_DIMS:
        raise FrameError("bad_buffer_meta", f"buffer {i} description has {len(shape)} dimensions, limit {MAX_DIMS}")
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= max_bytes:
            raise FrameError("bad_buffer_meta", f"buffer {i} description {safe_repr(m)} is not [dtype, shape] "
                                                f"(each dimension an integer in [0, {max_bytes}])")
    n = ALLOWED_DTYPES[m[0]].itemsize
    for d in shape:  # at most MAX_DIMS factors of at most max_bytes: a small exact integer
        n *= d
    if n != size:
        raise FrameError("buffer_size", f"buffer {i} is {size} bytes, its description says {n}")
    return m[0], tuple(shape)


def safe_repr(value: Any, limit: int = 200) -> str:
    """A bounded repr of a hostile value: never raises, never recurses deeply, never formats huge numbers."""
    try:
        text = _REPR.repr(value)
    except Exception:  # e.g. an int over the digit limit, or a repr that raises
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _make_repr() -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxlong, r.maxother = 3, 80, 40, 80
    r.maxdict = r.maxlist = r.maxtuple = r.maxset = 8
    return r


_REPR = _make_repr()


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed in a header")


def _buffer(frame: Any) -> memoryview:
    """A frame's bytes as a memoryview (bytes-like objects and zmq.Frame)."""
    try:
        view = memoryview(frame.buffer if hasattr(frame, "buffer") else frame)  # zmq.Frame has .buffer
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError):
        raise FrameError("bad_frame", f"a frame of type {type(frame).__name__} is not contiguous bytes") from None


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
