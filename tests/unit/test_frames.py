"""Unit tests for the wire format (wan/frames.py): encode/decode, every decode rejection, fencing, overhead."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from wan.frames import (
    ALLOWED_DTYPES,
    PROTOCOL_VERSION,
    TRAFFIC_CLASSES,
    Fence,
    FrameError,
    Message,
    check_fence,
    decode,
    encode,
    wire_overhead,
)

LIMITS = {"max_frame_bytes": 1 << 20, "max_header_bytes": 1 << 16}


def header(**changes: Any) -> dict[str, Any]:
    """A valid header map (no buffers); `changes` replace fields."""
    h: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "run": "run-1",
        "epoch": 3,
        "step": 7,
        "src": "a",
        "inc": 12345,
        "kind": "coll",
        "cls": "collective",
        "seq": 9,
        "body": {"round": 2},
        "bufs": [],
    }
    h.update(changes)
    return h


def packed(h: dict[str, Any]) -> bytes:
    return msgpack.packb(h, use_bin_type=True)


def reject(frames: list[Any], **limits: int) -> FrameError:
    with pytest.raises(FrameError) as ei:
        decode(frames, **{**LIMITS, **limits})
    return ei.value


# ---------------------------------------------------------------- encode / decode round trip


def sample_arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal(5).astype(np.float16),
        rng.integers(-128, 128, size=(2, 2, 2), dtype=np.int8),
        rng.integers(0, 256, size=7, dtype=np.uint8),
        rng.integers(-(2**40), 2**40, size=(1, 3), dtype=np.int64),
        np.zeros(0, dtype=np.float32),  # empty buffer
        np.array(2.5, dtype=np.float32),  # 0-d scalar
    ]


def test_round_trip_preserves_fields_dtypes_shapes_and_values() -> None:
    arrays = sample_arrays()
    frames = encode(kind="coll", cls="collective", run="run-1", epoch=3, step=7, src="a", inc=12345, seq=9,
                    body={"round": 2, "phase": "rs"}, arrays=arrays)
    assert len(frames) == 1 + len(arrays)
    msg = decode(frames, **LIMITS)
    assert (msg.kind, msg.cls, msg.run, msg.epoch, msg.step, msg.src, msg.inc, msg.seq) == (
        "coll", "collective", "run-1", 3, 7, "a", 12345, 9)
    assert msg.body == {"round": 2, "phase": "rs"}
    assert msg.buf_meta == [("float32", (3, 4)), ("float16", (5,)), ("int8", (2, 2, 2)), ("uint8", (7,)),
                            ("int64", (1, 3)), ("float32", (0,)), ("float32", ())]
    for i, a in enumerate(arrays):
        got = msg.array(i)
        assert got.dtype == a.dtype
        assert got.shape == a.shape
        np.testing.assert_array_equal(got, a)
    assert msg.wire_bytes == len(frames[0]) + sum(a.nbytes for a in arrays)


def test_empty_multidimensional_array_round_trips() -> None:
    a = np.zeros((0, 3), dtype=np.float32)
    frames = encode(kind="k", cls="control", run="r", epoch=0, step=0, src="a", inc=1, seq=0, arrays=[a])
    assert decode(frames, **LIMITS).array(0).shape == (0, 3)


def test_encode_does_not_copy_arrays() -> None:
    arrays = sample_arrays()[:5]
    frames = encode(kind="k", cls="control", run="r", epoch=0, step=0, src="a", inc=1, seq=0, arrays=arrays)
    for a, f in zip(arrays, frames[1:]):
        assert np.shares_memory(np.frombuffer(f, dtype=np.uint8), a)


def test_decoded_arrays_are_views_of_the_received_frames() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    frames = encode(kind="k", cls="control", run="r", epoch=0, step=0, src="a", inc=1, seq=0, arrays=[a])
    received = [bytes(frames[0]), bytearray(bytes(frames[1]))]
    msg = decode(received, **LIMITS)
    view = msg.array(0)
    received[1][0:4] = np.float32(42.0).tobytes()  # change the frame after decoding
    assert view[0, 0] == 42.0  # the array saw it: no copy was made
    assert view[1, 2] == 5.0


def test_decoded_arrays_of_immutable_frames_are_read_only() -> None:
    a = np.arange(4, dtype=np.int64)
    frames = encode(kind="k", cls="control", run="r", epoch=0, step=0, src="a", inc=1, seq=0, arrays=[a])
    msg = decode([bytes(f) for f in frames], **LIMITS)
    arr = msg.array(0)
    assert not arr.flags.writeable
    np.testing.assert_array_equal(arr, a)


def test_encode_rejects_unknown_class_non_contiguous_and_unsendable_dtypes() -> None:
    kw = dict(kind="k", run="r", epoch=0, step=0, src="a", inc=1, seq=0)
    with pytest.raises(ValueError, match="unknown traffic class 'bulk'"):
        encode(cls="bulk", **kw)
    with pytest.raises(ValueError, match="C-contiguous"):
        encode(cls="control", arrays=[np.zeros((4, 4), np.float32)[:, ::2]], **kw)
    for dt in (np.float64, np.uint16, np.dtype(">f4")):
        with pytest.raises(ValueError, match="cannot be sent"):
            encode(cls="control", arrays=[np.zeros(2, dtype=dt)], **kw)


def test_every_traffic_class_round_trips() -> None:
    for cls in TRAFFIC_CLASSES:
        frames = encode(kind="k", cls=cls, run="r", epoch=0, step=0, src="a", inc=1, seq=0)
        assert decode(frames, **LIMITS).cls == cls


def test_bfloat16_buffers_decode_as_raw_16_bit_words() -> None:
    words = np.array([0x3F80, 0xC000], dtype="<u2")  # bf16 1.0, -2.0
    msg = decode([packed(header(bufs=[["bfloat16", [2]]])), words.tobytes()], **LIMITS)
    assert msg.array(0).dtype == ALLOWED_DTYPES["bfloat16"]
    assert msg.array(0).tolist() == [0x3F80, 0xC000]


# ---------------------------------------------------------------- decode rejections


def test_no_frames_is_empty() -> None:
    assert reject([]).reason == "empty"


def test_header_over_limit_is_header_too_large() -> None:
    h = packed(header(body={"pad": "x" * 200}))
    e = reject([h], max_header_bytes=len(h) - 1)
    assert e.reason == "header_too_large"
    assert str(len(h)) in e.detail
    decode([h], **{**LIMITS, "max_header_bytes": len(h)})  # exactly at the limit is accepted


def test_message_over_limit_is_too_large() -> None:
    h = packed(header(bufs=[["uint8", [100]]]))
    frames = [h, bytes(100)]
    e = reject(frames, max_frame_bytes=len(h) + 99)
    assert e.reason == "too_large"
    assert str(len(h) + 100) in e.detail
    assert decode(frames, **{**LIMITS, "max_frame_bytes": len(h) + 100}).wire_bytes == len(h) + 100


@pytest.mark.parametrize("raw", [b"\xc1", b"\x8b\xa1v", packed(header()) + b"\x00", b""],
                         ids=["never_used_byte", "truncated_map", "trailing_data", "zero_bytes"])
def test_not_msgpack_is_malformed_header(raw: bytes) -> None:
    e = reject([raw])
    assert e.reason == "malformed_header"
    assert "not valid msgpack" in e.detail


@pytest.mark.parametrize("value", [[1, 2], "header", 5, None])
def test_msgpack_that_is_not_a_map_is_malformed_header(value: Any) -> None:
    e = reject([packed(value)])
    assert e.reason == "malformed_header"
    assert "expected a map" in e.detail


def test_non_string_map_key_is_malformed_header() -> None:
    assert reject([packed({1: 2, **header()})]).reason == "malformed_header"


@pytest.mark.parametrize("key", list(header().keys()))
def test_missing_field_is_malformed_header(key: str) -> None:
    h = header()
    del h[key]
    e = reject([packed(h)])
    assert e.reason == "malformed_header"
    assert e.detail == f"header lacks field {key!r}"


@pytest.mark.parametrize(
    "key,value,tname",
    [
        ("v", "1", "str"),
        ("run", 5, "int"),
        ("epoch", "3", "str"),
        ("epoch", 3.0, "float"),
        ("step", None, "NoneType"),
        ("src", ["a"], "list"),
        ("kind", {}, "dict"),
        ("seq", [9], "list"),
        ("body", [], "list"),
        ("bufs", {}, "dict"),
        # bool is a subclass of int in Python; the header must not accept it as one
        ("v", True, "bool"),
        ("epoch", True, "bool"),
        ("step", False, "bool"),
        ("inc", True, "bool"),
        ("seq", True, "bool"),
    ],
)
def test_wrong_field_type_is_malformed_header(key: str, value: Any, tname: str) -> None:
    e = reject([packed(header(**{key: value}))])
    assert e.reason == "malformed_header"
    assert e.detail == f"header field {key!r} has type {tname}"


def test_other_protocol_version_is_bad_version() -> None:
    e = reject([packed(header(v=PROTOCOL_VERSION + 1))])
    assert e.reason == "bad_version"
    assert e.detail == f"protocol version {PROTOCOL_VERSION + 1}, expected {PROTOCOL_VERSION}"


def test_unknown_traffic_class_is_bad_class() -> None:
    e = reject([packed(header(cls="bulk"))])
    assert e.reason == "bad_class"
    assert "'bulk'" in e.detail


@pytest.mark.parametrize("n_meta,n_bufs", [(1, 0), (0, 1), (2, 1)])
def test_described_and_actual_buffer_counts_differ_is_buffer_count(n_meta: int, n_bufs: int) -> None:
    h = packed(header(bufs=[["uint8", [1]]] * n_meta))
    e = reject([h, *[b"x"] * n_bufs])
    assert e.reason == "buffer_count"
    assert e.detail == f"header describes {n_meta} buffers, message has {n_bufs}"


@pytest.mark.parametrize(
    "meta",
    [
        "float32",  # not a list
        ["float32"],  # one element
        ["float32", [1], "extra"],  # three elements
        ["float64", [1]],  # dtype not allowed
        ["object", [1]],  # never reinterpret as objects
        ["float32", 4],  # shape not a list
        ["float32", [-1]],  # negative dimension
        ["float32", [1.0]],  # non-integer dimension
        ["float32", ["4"]],
    ],
)
def test_bad_buffer_description_is_bad_buffer_meta(meta: Any) -> None:
    e = reject([packed(header(bufs=[meta])), bytes(4)])
    assert e.reason == "bad_buffer_meta"
    assert e.detail.startswith("buffer 0 description")


@pytest.mark.parametrize("dtype_entry", [["float32"], {"a": 1}])
def test_unhashable_dtype_name_is_bad_buffer_meta(dtype_entry: Any) -> None:
    e = reject([packed(header(bufs=[[dtype_entry, [1]]])), bytes(4)])
    assert e.reason == "bad_buffer_meta"


def test_shape_whose_size_overflows_int64_is_rejected() -> None:
    with pytest.raises(FrameError) as ei:
        decode([packed(header(bufs=[["float32", [2**62, 4]]])), b""], **LIMITS)
    assert ei.value.reason in ("bad_buffer_meta", "buffer_size")


@pytest.mark.parametrize("meta,size", [(["float32", [3]], 8), (["float32", [2, 2]], 17), (["int64", []], 4),
                                       (["uint8", [0]], 1)])
def test_buffer_length_not_matching_its_description_is_buffer_size(meta: list, size: int) -> None:
    e = reject([packed(header(bufs=[meta])), bytes(size)])
    assert e.reason == "buffer_size"
    expected = ALLOWED_DTYPES[meta[0]].itemsize * int(np.prod(meta[1]))
    assert e.detail == f"buffer 0 is {size} bytes, its description says {expected}"


def test_second_buffer_size_mismatch_names_that_buffer() -> None:
    e = reject([packed(header(bufs=[["uint8", [2]], ["float16", [2]]])), b"ab", b"abc"])
    assert e.reason == "buffer_size"
    assert e.detail.startswith("buffer 1 is 3 bytes")


# ---------------------------------------------------------------- no pickle, no extension types


@pytest.mark.parametrize("ext", [msgpack.ExtType(1, b"x"), msgpack.ExtType(42, b"\x80\x04K\x01." * 3),
                                 msgpack.Timestamp(1, 0)], ids=["fixext1", "ext8_pickle_bytes", "timestamp"])
def test_header_with_msgpack_ext_type_is_rejected(ext: Any) -> None:
    e = reject([packed(header(body={"x": ext}))])
    assert e.reason == "malformed_header"


def test_header_with_bin_value_is_rejected() -> None:
    e = reject([packed(header(body={"blob": b"\x80\x04K\x01."}))])
    assert e.reason == "malformed_header"


def test_header_with_zero_length_ext_type_is_rejected() -> None:
    e = reject([packed(header(body={"x": msgpack.ExtType(1, b"")}))])
    assert e.reason == "malformed_header"


# ---------------------------------------------------------------- fencing


FENCE = Fence(run_id="run-1", epoch=3, members=frozenset({"a", "b", "coord"}))


def msg(**changes: Any) -> Message:
    base = dict(kind="coll", cls="collective", run="run-1", epoch=3, step=0, src="a", inc=1, seq=1)
    base.update(changes)
    return Message(**base)


def test_fence_rejects_other_run() -> None:
    ok, reason = check_fence(msg(run="run-0"), FENCE)
    assert not ok
    assert reason.startswith("wrong_run:")


def test_fence_rejects_unknown_member() -> None:
    ok, reason = check_fence(msg(src="z"), FENCE)
    assert not ok
    assert reason.startswith("unknown_member:")
    assert "'z'" in reason


def test_fence_rejects_stale_epoch() -> None:
    ok, reason = check_fence(msg(epoch=2), FENCE)
    assert not ok
    assert reason.startswith("stale_epoch:")
    assert reason == "stale_epoch: message epoch 2 < current epoch 3"


@pytest.mark.parametrize("epoch", [3, 4, 100])
def test_fence_accepts_same_or_newer_epoch(epoch: int) -> None:
    assert check_fence(msg(epoch=epoch), FENCE) == (True, "ok")


@pytest.mark.parametrize("kind", ["join", "ack"])
@pytest.mark.parametrize("epoch", [0, 2, 3, 9])
def test_fence_accepts_join_and_ack_regardless_of_epoch(kind: str, epoch: int) -> None:
    assert check_fence(msg(kind=kind, epoch=epoch), FENCE) == (True, "unfenced kind")


def test_unfenced_kinds_still_need_right_run_and_membership() -> None:
    assert check_fence(msg(kind="join", run="other"), FENCE)[1].startswith("wrong_run:")
    assert check_fence(msg(kind="ack", src="z"), FENCE)[1].startswith("unknown_member:")


def test_fence_checks_run_before_membership() -> None:
    assert check_fence(msg(run="other", src="z", epoch=0), FENCE)[1].startswith("wrong_run:")
    assert check_fence(msg(src="z", epoch=0), FENCE)[1].startswith("unknown_member:")


# ---------------------------------------------------------------- wire overhead


@pytest.mark.parametrize("n,expected", [(0, 2), (1, 2), (255, 2), (256, 9), (10_000, 9)])
def test_zmtp_short_and_long_frame_headers(n: int, expected: int) -> None:
    assert wire_overhead([n], curve=False) == expected


@pytest.mark.parametrize("n,expected", [(0, 35), (222, 35), (223, 42), (256, 42), (10_000, 42)])
def test_curve_adds_33_bytes_and_may_cross_the_short_header_boundary(n: int, expected: int) -> None:
    # body = n + 33: short header while body <= 255 (n <= 222), long header after
    assert wire_overhead([n], curve=True) == expected


def test_curve_costs_33_more_per_large_frame() -> None:
    sizes = [300, 1000, 1 << 20]
    assert wire_overhead(sizes, curve=False) == 9 * 3
    assert wire_overhead(sizes, curve=True) - wire_overhead(sizes, curve=False) == 33 * 3


def test_overhead_sums_over_frames() -> None:
    assert wire_overhead([], curve=True) == 0
    assert wire_overhead([10, 255, 256], curve=False) == 2 + 2 + 9
    assert wire_overhead([10, 222, 223], curve=True) == 35 + 35 + 42
