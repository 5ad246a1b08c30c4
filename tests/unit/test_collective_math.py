"""Pure parts of the collective (site_agent/collective.py): reduction order and compression."""

from __future__ import annotations

import numpy as np
import pytest

from site_agent.collective import compress, decompress, reduce_in_order, roundtrip


def bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------- reduction order


def test_reduce_in_order_is_left_to_right_float32_sum_divided_by_n_bitwise() -> None:
    rng = np.random.default_rng(0)
    g0, g1, g2 = (rng.standard_normal(10_000).astype(np.float32) * s for s in (1.0, 1e3, 1e-3))
    expected = ((g0 + g1) + g2) / np.float32(3)
    assert expected.dtype == np.float32
    out = reduce_in_order([g0, g1, g2])
    assert out.dtype == np.float32
    assert out.shape == g0.shape
    np.testing.assert_array_equal(bits(out), bits(expected))


def test_summation_order_changes_the_result_on_adversarial_values() -> None:
    # In float32, 1e8 + 1 == 1e8 (spacing at 1e8 is 8): whether the 1 survives depends on the order.
    big = np.array([1e8, 3.0, -7.5e7], dtype=np.float32)
    one = np.array([1.0, 1e-7, 3.3], dtype=np.float32)
    neg = np.array([-1e8, -3.0, 7.5e7], dtype=np.float32)
    fixed = reduce_in_order([big, one, neg])
    other = ((big + neg) + one) / np.float32(3)
    assert fixed[0] == np.float32(0.0)  # (1e8 + 1) - 1e8 == 0: the 1 was absorbed
    assert other[0] == np.float32(1.0) / np.float32(3)  # (1e8 - 1e8) + 1 == 1
    assert not np.array_equal(bits(fixed), bits(other))
    # ...and the order of the arguments is the order of summation
    np.testing.assert_array_equal(bits(reduce_in_order([big, neg, one])), bits(other))


def test_reduce_in_order_does_not_modify_inputs_and_handles_one_contribution() -> None:
    rng = np.random.default_rng(1)
    g = rng.standard_normal(17).astype(np.float32)
    before = g.copy()
    out = reduce_in_order([g])
    np.testing.assert_array_equal(bits(out), bits(before))
    assert not np.shares_memory(out, g)
    np.testing.assert_array_equal(bits(g), bits(before))


def test_reduce_in_order_is_deterministic() -> None:
    rng = np.random.default_rng(2)
    gs = [rng.standard_normal(1000).astype(np.float32) for _ in range(5)]
    np.testing.assert_array_equal(bits(reduce_in_order(gs)), bits(reduce_in_order([g.copy() for g in gs])))


# ---------------------------------------------------------------- compression


def data(n: int = 4096, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 0.05).astype(np.float32)


def test_no_compression_sends_the_float32_values_unchanged() -> None:
    x = data()
    payload, scale = compress(x, "none")
    assert payload.dtype == np.float32 and scale == 1.0
    np.testing.assert_array_equal(bits(decompress(payload, scale)), bits(x))


def test_fp16_compression_is_a_half_precision_cast() -> None:
    x = data()
    payload, scale = compress(x, "fp16")
    assert payload.dtype == np.float16 and scale == 1.0
    assert payload.nbytes == x.nbytes // 2
    back = decompress(payload, scale)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, x.astype(np.float16).astype(np.float32))
    normal = np.abs(x) > 2**-14  # fp16 normal range: relative error at most 2**-11
    assert np.all(np.abs(back[normal] - x[normal]) <= np.abs(x[normal]) * 2**-11)


def test_int8_compression_error_is_at_most_half_a_step() -> None:
    x = data()
    payload, scale = compress(x, "int8")
    assert payload.dtype == np.int8
    assert payload.nbytes == x.nbytes // 4
    amax = float(np.max(np.abs(x)))
    assert scale == pytest.approx(amax / 127.0, rel=1e-12)
    assert int(np.max(np.abs(payload.astype(np.int32)))) == 127  # the absmax value uses the full range
    back = decompress(payload, scale)
    assert back.dtype == np.float32
    err = np.max(np.abs(back.astype(np.float64) - x.astype(np.float64)))
    # half a quantisation step, plus one float32 rounding of the largest value
    assert err <= scale / 2 + float(np.spacing(np.float32(amax)))
    assert err > scale / 4  # it really is lossy: the bound is not vacuous


def test_int8_of_all_zeros_has_scale_one_and_zeros() -> None:
    x = np.zeros(100, dtype=np.float32)
    payload, scale = compress(x, "int8")
    assert scale == 1.0
    assert payload.dtype == np.int8 and not payload.any()
    back = decompress(payload, scale)
    assert back.dtype == np.float32 and not back.any()


def test_int8_of_empty_input_has_scale_one() -> None:
    payload, scale = compress(np.zeros(0, dtype=np.float32), "int8")
    assert scale == 1.0 and payload.size == 0 and payload.dtype == np.int8


def test_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compression 'zstd'"):
        compress(data(8), "zstd")


# ---------------------------------------------------------------- roundtrip


def test_roundtrip_without_compression_is_identity() -> None:
    x = data()
    assert roundtrip(x, "none", 100) is x


@pytest.mark.parametrize("how", ["fp16", "int8"])
@pytest.mark.parametrize("part_elems", [1, 7, 1000, 4096, 10_000])
def test_roundtrip_equals_partwise_compress_decompress(how: str, part_elems: int) -> None:
    x = data(4096)
    x[:512] *= 100  # parts have different magnitudes, so per-part int8 scales differ
    expected = np.concatenate([decompress(*compress(x[o:o + part_elems], how))
                               for o in range(0, x.size, part_elems)])
    out = roundtrip(x, how, part_elems)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_array_equal(bits(out), bits(expected))


def test_int8_roundtrip_scales_each_part_separately() -> None:
    x = data(2048)
    x[:1024] *= 100
    per_part = roundtrip(x, "int8", 1024)
    whole = decompress(*compress(x, "int8"))
    # the small second half is quantised far more finely with its own scale
    err_parts = np.max(np.abs(per_part[1024:] - x[1024:]))
    err_whole = np.max(np.abs(whole[1024:] - x[1024:]))
    assert err_parts < err_whole / 10
