"""Safe, bounded text and numbers about what came off a ZeroMQ socket.

Exception descriptions, routing ids and connection file descriptors, for log lines that must never
raise or grow without bound (an insider chooses the bytes), and a message's bytes on the wire.
"""

from __future__ import annotations

from typing import Any

import zmq

from wan.frames import wire_overhead


def describe_error(e: BaseException) -> str:
    """'Type: message', bounded, even for an exception whose str() raises."""
    try:
        text = str(e)
    except Exception:
        text = "<unprintable>"
    return f"{type(e).__name__}: {text[:300]}"


def src_fd(frame: Any) -> int | None:
    """The file descriptor of the connection a received frame came over (ZMQ_SRCFD), if known."""
    try:
        fd = frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError, TypeError):
        return None
    return int(fd) if isinstance(fd, int) and fd >= 0 else None


def peer_text(rid: Any) -> str:
    try:
        raw = rid.bytes if isinstance(rid, zmq.Frame) else bytes(rid)
    except Exception:
        return "?"
    return raw[:64].decode("utf-8", "replace")


def wire_size(frames: list[Any], curve: bool) -> int:
    sizes = [len(f) if not isinstance(f, zmq.Frame) else len(f.buffer) for f in frames]
    return sum(sizes) + wire_overhead(sizes, curve)

