"""Seeded fuzzing of the wire format: whatever bytes arrive, `decode` raises only FrameError or succeeds.

Each case is built from a fixed seed: random bytes, mutated and truncated valid messages, headers
nested far too deep, huge numbers in every integer slot (shapes of hundreds of 2^64-1
dimensions, epochs past 2^63), wrong types in every field, random msgpack trees, ext and bin
values. A decoded message must then pass through `check_fence`, `repr` and `Message.array`
without raising; a rejection's text must be bounded. Decoding must stay fast (bounded work).
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

import msgpack
import numpy as np
import pytest

from wan.frames import (
    MAX_DEPTH,
    MAX_DETAIL_CHARS,
    PROTOCOL_VERSION,
    Fence,
    FrameError,
    Message,
    check_fence,
    decode,
    encode,
    safe_repr,
)

LIMITS = {"max_frame_bytes": 1 << 20, "max_header_bytes": 1 << 16}
FENCE = Fence(run_id="run-1", epoch=3, members=frozenset({"a", "b", "coord"}))
U64 = 2**64 - 1
FIELDS = ("v", "run", "epoch", "step", "src", "inc", "kind", "cls", "seq", "body", "bufs")


def valid_frames(rng: random.Random) -> list[bytes]:
    arrays = [np.arange(rng.randint(0, 40), dtype=np.float32), np.zeros((2, rng.randint(0, 3)), dtype=np.int8)]
    frames = encode(kind=rng.choice(["coll", "membership", "heartbeat", "ack"]), cls="collective", run="run-1",
                    epoch=rng.randint(0, 6), step=rng.randint(0, 9), src=rng.choice(["a", "b", "z"]), inc=7,
                    seq=rng.randint(0, 5), body={"round": rng.randint(0, 3), "scale": 1.0}, arrays=arrays)
    return [bytes(f) for f in frames]


def valid_header(rng: random.Random) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "run": "run-1", "epoch": 3, "step": 1, "src": "a", "inc": 5, "kind": "coll",
            "cls": "collective", "seq": rng.randint(0, 3), "body": {"round": 1}, "bufs": []}


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """A random msgpack-able value; may be deep, huge, or of an odd type."""
    choice = rng.randrange(12 if depth < 6 else 8)
    if choice == 0:
        return rng.choice([0, -1, 1, U64, -(2**63), 2**63, 2**63 - 1, rng.randrange(-(2**63), 2**64)])
    if choice == 1:
        return rng.choice([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e308, rng.random()])
    if choice == 2:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(0, 20)))
    if choice == 3:
        return rng.choice([None, True, False])
    if choice == 4:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 8)))
    if choice == 5:
        return msgpack.ExtType(rng.randrange(0, 128), bytes(rng.randrange(0, 4)))
    if choice == 6:
        return "x" * rng.choice([0, 127, 128, 129, 5000])
    if choice == 7:
        return msgpack.Timestamp(rng.randrange(0, 2**32), 0)
    if choice in (8, 9):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    return {str(random_value(rng, depth + 1))[:10]: random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))}


def nested(depth: int, leaf: Any = 1, as_map: bool = False) -> Any:
    v = leaf
    for _ in range(depth):
        v = {"k": v} if as_map else [v]
    return v


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# ---------------------------------------------------------------- case generators


def case_random_bytes(rng: random.Random) -> list[bytes]:
    return [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64))) for _ in range(rng.randrange(1, 4))]


def case_mutated(rng: random.Random) -> list[bytes]:
    frames = [bytearray(f) for f in valid_frames(rng)]
    for _ in range(rng.randrange(1, 6)):
        f = frames[rng.randrange(len(frames))]
        op = rng.randrange(4)
        if op == 0 and f:
            f[rng.randrange(len(f))] ^= 1 << rng.randrange(8)
        elif op == 1 and f:
            del f[rng.randrange(len(f)):]  # truncate
        elif op == 2:
            f.insert(rng.randrange(len(f) + 1), rng.randrange(256))
        elif f:
            f[rng.randrange(len(f))] = rng.choice([0xC1, 0xDC, 0xDD, 0xDE, 0xDF, 0xDB, 0xC7, 0xD9, 0xFF])
    if rng.random() < 0.2:
        frames.pop(rng.randrange(len(frames)))
    if rng.random() < 0.2:
        frames.append(bytearray(rng.randrange(8)))
    return [bytes(f) for f in frames]


def case_deep(rng: random.Random) -> list[bytes]:
    depth = rng.choice([MAX_DEPTH - 2, MAX_DEPTH, MAX_DEPTH + 1, 100, 1000, 1500, 5000])
    h = valid_header(rng)
    where = rng.randrange(3)
    if where == 0:
        h["body"] = {"x": nested(depth, as_map=rng.random() < 0.5)}
    elif where == 1:
        h["bufs"] = [["uint8", nested(depth)]]
    else:
        h["run"] = nested(depth)
    try:
        return [pack(h), b"\x00"] if where == 1 else [pack(h)]
    except (ValueError, RecursionError):  # msgpack refuses to pack it: send the raw nesting bytes
        return [b"\x91" * depth + b"\x01"]


def case_huge_numbers(rng: random.Random) -> list[bytes]:
    h = valid_header(rng)
    kind = rng.randrange(5)
    if kind == 0:  # the shape: a few hundred dimensions of 2^64-1
        h["bufs"] = [["float32", [U64] * rng.randrange(100, 600)]]
        return [pack(h), b"\x00" * 4]
    if kind == 1:
        h["bufs"] = [["float32", [0, U64]], ["uint8", [U64, 0, U64]]]
        return [pack(h), b"", b""]
    if kind == 2:
        h[rng.choice(["epoch", "step", "inc", "seq", "v"])] = rng.choice([U64, -(2**63), 2**63, -1])
        return [pack(h)]
    if kind == 3:
        h["bufs"] = [["int64", [2**20, 2**20, 2**20]]]
        return [pack(h), b"\x00" * 8]
    h["body"] = {"n": U64, "neg": -(2**63), "inf": float("inf")}
    return [pack(h)]


def case_wrong_types(rng: random.Random) -> list[bytes]:
    h = valid_header(rng)
    key = rng.choice(FIELDS)
    if rng.random() < 0.2:
        del h[key]
    else:
        h[key] = random_value(rng)
    if rng.random() < 0.3:
        h[str(random_value(rng))[:8]] = random_value(rng)
    n = len(h["bufs"]) if isinstance(h.get("bufs"), list) else rng.randrange(3)
    try:
        head = pack(h)
    except (ValueError, OverflowError, TypeError):
        head = pack(valid_header(rng))
    return [head, *[bytes(rng.randrange(16)) for _ in range(n)]]


def case_random_tree(rng: random.Random) -> list[bytes]:
    try:
        return [pack(random_value(rng))]
    except (ValueError, OverflowError, TypeError):
        return [b"\x80"]


def case_many_buffers(rng: random.Random) -> list[bytes]:
    n = rng.choice([63, 64, 65, 200, 5000])
    h = valid_header(rng)
    h["bufs"] = [["uint8", [1]]] * n
    return [pack(h), *[b"x"] * rng.choice([n, min(n, 70)])]


CASES: list[Callable[[random.Random], list[bytes]]] = [
    case_random_bytes, case_mutated, case_deep, case_huge_numbers, case_wrong_types, case_random_tree,
    case_many_buffers,
]


def exercise(frames: list[bytes]) -> str:
    """Decode, fence, repr and view one input; return 'ok' or the rejection reason. Anything else raises."""
    try:
        msg = decode(frames, **LIMITS)
    except FrameError as e:
        assert len(e.detail) <= MAX_DETAIL_CHARS + 3
        assert isinstance(str(e), str) and isinstance(repr(e), str)
        return e.reason
    ok, reason = check_fence(msg, FENCE)
    assert isinstance(ok, bool) and isinstance(reason, str)
    assert isinstance(repr(msg), str)
    for i in range(len(msg.bufs)):
        assert msg.array(i).nbytes == msg.bufs[i].nbytes
    return "ok"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_thousands_of_hostile_frames_raise_only_frame_error(seed: int) -> None:
    rng = random.Random(seed)
    tally: dict[str, int] = {}
    t0 = time.perf_counter()
    for _ in range(4000):
        frames = CASES[rng.randrange(len(CASES))](rng)
        reason = exercise(frames)
        tally[reason] = tally.get(reason, 0) + 1
    elapsed = time.perf_counter() - t0
    assert sum(tally.values()) == 4000
    assert {"malformed_header", "buffer_count", "bad_buffer_meta"} <= set(tally), tally
    assert elapsed < 60, f"4000 decodes took {elapsed:.1f} s"


def test_shape_of_hundreds_of_max_dimensions_is_rejected_quickly_and_printably() -> None:
    h = valid_header(random.Random(0))
    h["bufs"] = [["float32", [U64] * 300]]
    t0 = time.perf_counter()
    with pytest.raises(FrameError) as ei:
        decode([pack(h), b"\x00" * 4], **LIMITS)
    assert time.perf_counter() - t0 < 0.5
    assert ei.value.reason == "bad_buffer_meta"
    assert "300 dimensions" in ei.value.detail


def test_dimension_above_the_message_limit_is_rejected_even_when_another_is_zero() -> None:
    h = valid_header(random.Random(0))
    h["bufs"] = [["float32", [0, U64]]]
    with pytest.raises(FrameError) as ei:
        decode([pack(h), b""], **LIMITS)
    assert ei.value.reason == "bad_buffer_meta"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 1020])
def test_header_nested_too_deep_is_malformed(depth: int) -> None:
    h = valid_header(random.Random(0))
    h["body"] = {"x": nested(depth)}
    try:
        raw = pack(h)
    except ValueError:
        pytest.skip("msgpack cannot pack this depth")
    with pytest.raises(FrameError) as ei:
        decode([raw], **LIMITS)
    assert ei.value.reason == "malformed_header"
    assert "deeper" in ei.value.detail or "not valid msgpack" in ei.value.detail


def test_raw_nesting_deeper_than_msgpack_stack_is_malformed() -> None:
    with pytest.raises(FrameError) as ei:
        decode([b"\x91" * 100_000 + b"\x01"], max_frame_bytes=1 << 20, max_header_bytes=1 << 20)
    assert ei.value.reason == "malformed_header"


def test_header_at_the_depth_limit_decodes() -> None:
    h = valid_header(random.Random(0))
    h["body"] = {"x": nested(MAX_DEPTH - 2)}  # header map (1) + body (2) + MAX_DEPTH - 2 lists
    assert decode([pack(h)], **LIMITS).body["x"] == nested(MAX_DEPTH - 2)


@pytest.mark.parametrize("field,value", [("epoch", U64), ("epoch", -1), ("seq", -5), ("inc", 2**63),
                                         ("step", 2**63)])
def test_envelope_integer_outside_64_bit_range_is_malformed(field: str, value: int) -> None:
    h = valid_header(random.Random(0))
    h[field] = value
    with pytest.raises(FrameError) as ei:
        decode([pack(h)], **LIMITS)
    assert ei.value.reason == "malformed_header"
    assert repr(field) in ei.value.detail


@pytest.mark.parametrize("field", ["run", "src", "kind"])
def test_overlong_name_is_malformed(field: str) -> None:
    h = valid_header(random.Random(0))
    h[field] = "n" * 5000
    with pytest.raises(FrameError) as ei:
        decode([pack(h)], **LIMITS)
    assert ei.value.reason == "malformed_header"
    assert "5000 characters" in ei.value.detail


def test_more_buffer_frames_than_allowed_is_buffer_count() -> None:
    h = valid_header(random.Random(0))
    with pytest.raises(FrameError) as ei:
        decode([pack(h), *[b"x"] * 100], **LIMITS)
    assert ei.value.reason == "buffer_count"


def test_frame_that_is_not_bytes_is_bad_frame() -> None:
    with pytest.raises(FrameError) as ei:
        decode([pack(valid_header(random.Random(0))), 12345], **LIMITS)  # type: ignore[list-item]
    assert ei.value.reason == "bad_frame"


def test_safe_repr_never_raises_on_huge_numbers_deep_nesting_or_broken_reprs() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    huge = 10**5000  # formatting it raises ValueError (int max str digits)
    assert safe_repr(huge) == "<unprintable int>"
    assert "Broken" in safe_repr(Broken())
    deep: Any = 1
    for _ in range(100_000):
        deep = [deep]
    assert safe_repr(deep).startswith("[[[")
    assert len(safe_repr("z" * 10_000)) <= 203
    assert "Message(" in repr(Message(kind="k", cls="control", run="r", epoch=0, step=0, src="a", inc=1, seq=0,
                                      body={"x": deep, "n": huge}))
