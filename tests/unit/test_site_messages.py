"""A site trusts no body: membership, shutdown, collective and state-transfer bodies that do not fit
their type are rejected with a precise reason (never an OverflowError, a KeyError or a crash).

Messages are built with the real wire encoder and decoder (`wan.frames.encode` / `decode`), so
what is parsed here is exactly what a site's inbox would hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ground.fields import Rejected
from ground.plans import Drain, EpochPlan, Plan, Restore
from site_agent.messages import CollLimits, parse_coll_part, parse_plan, parse_shutdown, parse_state_chunk
from wan.frames import decode, encode

SITES = frozenset({"a", "b", "c"})
GOOD_PLAN = {"epoch": 3, "members": ["c", "a"], "paused": False, "start_round": 4, "start_cursor": 96,
             "restore": "donor", "donor": "a", "joiners": ["c"], "manifest_hash": None, "parent_commit": None,
             "target_samples": 768, "frontier_manifest": "ab" * 32, "checkpoint_first": False}


def wire(kind: str, body: dict[str, Any], *, src: str = "coord", epoch: int = 3, arrays: list[np.ndarray] = ()):
    frames = encode(kind=kind, cls="control", run="r1", epoch=epoch, step=0, src=src, inc=1, seq=1, body=body,
                    arrays=list(arrays))
    return decode(frames, max_frame_bytes=1 << 24, max_header_bytes=1 << 16)


def rejected(fn, *args) -> Rejected:
    with pytest.raises(Rejected) as ei:
        fn(*args)
    return ei.value


# ------------------------------------------------------------------------------------- membership
def test_a_well_formed_plan_parses_into_a_typed_frozen_plan_with_sorted_members():
    p = parse_plan(wire("membership", GOOD_PLAN), SITES, "coord")
    assert p == EpochPlan(epoch=3, members=("a", "c"), paused=False, start_round=4, start_cursor=96,
                          restore=Restore.DONOR, donor="a", joiners=("c",), manifest_hash=None,
                          frontier_manifest="ab" * 32, checkpoint_first=False, parent_commit=None, target_samples=768)
    with pytest.raises(AttributeError):
        p.epoch = 4  # type: ignore[misc]


def test_the_announced_plan_decodes_to_the_same_typed_plan_and_the_drain_is_a_field():
    # The coordinator's typed Plan, announced and sent, is the site's typed EpochPlan: the oracle's
    # drain travels as a field (never a phrase in a reason string).
    plan = Plan(("a", "c"), False, 5, 160, Restore.NONE, drain=Drain("b", 250))
    sent = EpochPlan.announce(4, plan, target_samples=768, frontier_manifest=None, checkpoint_first=True)
    got = parse_plan(wire("membership", sent.to_body(), epoch=4), SITES, "coord")
    assert got == sent and got.drain == Drain("b", 250) and got.checkpoint_first


@pytest.mark.parametrize("drain", [{"site": "zz", "at_cursor": 3}, {"site": "b"}, {"site": "b", "at_cursor": -1},
                                   ["b", 3], "b"])
def test_a_drain_that_does_not_fit_is_rejected(drain):
    e = rejected(parse_plan, wire("membership", {**GOOD_PLAN, "drain": drain}), SITES, "coord")
    assert e.reason in ("bad_field", "missing_field"), (e.reason, e.detail)
    assert "drain" in e.detail


@pytest.mark.parametrize("change,reason,words", [
    ({"epoch": "zz"}, "bad_field", "'epoch' must be an integer, got str 'zz'"),
    ({"epoch": 3.0}, "bad_field", "'epoch' must be an integer, got float"),
    ({"epoch": True}, "bad_field", "'epoch' must be an integer, got bool"),
    ({"epoch": 4}, "epoch_mismatch", "body epoch 4 != message epoch 3"),
    ({"members": "abc"}, "bad_field", "'members' must be a list of site names"),
    ({"members": [["a"], {"x": 1}]}, "bad_field", "holds non-names"),
    ({"members": ["a", "a"]}, "bad_field", "names a site twice"),
    ({"members": ["a", "mallory"], "joiners": [], "restore": "none"}, "unknown_site", "['mallory']"),
    ({"start_round": -1}, "bad_field", "'start_round' = -1 is outside [0,"),
    ({"start_round": 2**63}, "bad_field", "'start_round' = 9223372036854775808 is outside"),
    ({"start_cursor": float("inf")}, "bad_field", "'start_cursor' must be an integer, got float inf"),
    ({"start_cursor": float("nan")}, "bad_field", "'start_cursor' must be an integer, got float nan"),
    ({"paused": "no"}, "bad_field", "'paused' must be a boolean"),
    ({"restore": "pray"}, "bad_field", "'restore' = 'pray', expected one of"),
    ({"donor": "b"}, "inconsistent_plan", "needs a donor among the members"),
    ({"joiners": ["b"]}, "inconsistent_plan", "joiners ['b'] are not all members"),
    ({"manifest_hash": "not-a-hash"}, "bad_field", "'manifest_hash' = 'not-a-hash' is not of the form"),
    ({"checkpoint_first": 1}, "bad_field", "'checkpoint_first' must be a boolean, got int 1"),
])
def test_a_membership_body_that_does_not_fit_is_rejected_with_the_field_and_why(change, reason, words):
    e = rejected(parse_plan, wire("membership", {**GOOD_PLAN, **change}), SITES, "coord")
    assert e.reason == reason, e
    assert words in e.detail, e.detail


@pytest.mark.parametrize("field", ["epoch", "members", "paused", "start_round", "start_cursor", "restore"])
def test_a_membership_body_missing_a_required_field_names_it(field):
    body = {k: v for k, v in GOOD_PLAN.items() if k != field}
    e = rejected(parse_plan, wire("membership", body), SITES, "coord")
    assert (e.reason, e.detail) == ("missing_field", f"membership body lacks field {field!r}")


def test_a_membership_from_anyone_but_the_coordinator_is_rejected():
    e = rejected(parse_plan, wire("membership", GOOD_PLAN, src="b"), SITES, "coord")
    assert e.reason == "not_coordinator" and "'b'" in e.detail


def test_a_huge_nested_value_is_described_briefly_not_formatted_in_full():
    nested: Any = 1
    for _ in range(12):  # the wire decoder itself refuses deeper nesting
        nested = [nested]
    e = rejected(parse_plan, wire("membership", {**GOOD_PLAN, "members": nested}), SITES, "coord")
    assert e.reason == "bad_field" and len(e.detail) < 300
    e = rejected(parse_plan, wire("membership", {**GOOD_PLAN, "epoch": 2**64 - 1}), SITES, "coord")
    assert "'epoch' = 18446744073709551615 is outside [1," in e.detail and len(e.detail) < 300


def test_a_shutdown_must_come_from_the_coordinator_and_give_a_string_reason():
    assert parse_shutdown(wire("shutdown", {"reason": "all sites done"}), "coord").reason == "all sites done"
    assert rejected(parse_shutdown, wire("shutdown", {"reason": {"x": 1}}), "coord").reason == "bad_field"
    assert rejected(parse_shutdown, wire("shutdown", {}, src="store"), "coord").reason == "not_coordinator"


# ------------------------------------------------------------------------------------- collective parts
LIM = CollLimits(compression="none", part_elems=4, max_total=10, attest=True, max_samples=8, sample_id_limit=100)
GOOD_PART = {"round": 2, "phase": "rs", "shard": 1, "offset": 0, "total": 6, "scale": 1.0}
IDS = np.array([5, 7, 9], dtype=np.int64)


def part(body: dict[str, Any], arrays: list[np.ndarray] | None = None):
    arrays = [np.ones(4, dtype=np.float32), IDS] if arrays is None else arrays
    return wire("coll", body, src="b", epoch=1, arrays=arrays)


def test_a_well_formed_part_carries_float32_values_and_the_senders_sample_ids():
    p = parse_coll_part(part(GOOD_PART), LIM)
    assert (p.round, p.phase, p.shard, p.offset, p.total, p.src, p.epoch) == (2, "rs", 1, 0, 6, "b", 1)
    assert p.values.dtype == np.float32 and p.values.tolist() == [1.0] * 4
    assert p.samples.tolist() == [5, 7, 9]
    tail = parse_coll_part(part({**GOOD_PART, "offset": 4}, [np.ones(2, dtype=np.float32)]), LIM)
    assert tail.samples is None and tail.values.size == 2


@pytest.mark.parametrize("change,reason,words", [
    ({"round": "x"}, "bad_field", "'round' must be an integer, got str 'x'"),
    ({"round": float("inf")}, "bad_field", "'round' must be an integer, got float inf"),
    ({"round": None}, "bad_field", "'round' must be an integer, got NoneType"),
    ({"phase": "zz"}, "bad_field", "'phase' = 'zz'"),
    ({"shard": -1}, "bad_field", "'shard' = -1 is outside"),
    ({"total": 11}, "bad_field", "'total' = 11 is outside [0, 11)"),
    ({"offset": 2}, "bad_field", "offset 2 is not a multiple of the part size 4"),
    ({"offset": 8}, "bad_field", "'offset' = 8 is outside [0, 6)"),
    ({"scale": float("inf")}, "non_finite", "'scale' = inf is not a finite number"),
    ({"scale": float("-inf")}, "non_finite", "'scale' = -inf is not a finite number"),
    ({"scale": float("nan")}, "non_finite", "'scale' = nan"),
    ({"scale": 1e300}, "bad_field", "'scale' = 1e+300 is outside (0, 1e+30)"),
    ({"scale": 0.0}, "bad_field", "'scale' = 0.0 is outside"),
    ({"scale": 2**64 - 1}, "bad_field", "scale 1.8446744073709552e+19 on a float32 payload"),
    ({"scale": "1"}, "bad_field", "'scale' must be a number, got str"),
    ({"scale": 2.0}, "bad_field", "scale 2.0 on a float32 payload"),
])
def test_a_collective_part_with_an_ill_typed_or_out_of_range_field_is_rejected(change, reason, words):
    e = rejected(parse_coll_part, part({**GOOD_PART, **change}), LIM)
    assert e.reason == reason, e
    assert words in e.detail, e.detail


@pytest.mark.parametrize("arrays,reason,words", [
    ([], "bad_payload", "carries no payload buffer"),
    ([np.ones(4, dtype=np.float16), IDS], "bad_payload", "payload dtype float16, this cluster sends float32"),
    ([np.ones(3, dtype=np.float32), IDS], "bad_payload", "payload shape [3] at offset 0 of 6: expected [4]"),
    ([np.ones((2, 2), dtype=np.float32), IDS], "bad_payload", "payload shape [2, 2]"),
    ([np.array([1, np.inf, 2, 3], dtype=np.float32), IDS], "non_finite", "1 infinite or NaN value(s) of 4"),
    ([np.array([np.nan] * 4, dtype=np.float32), IDS], "non_finite", "4 infinite or NaN value(s)"),
    ([np.ones(4, dtype=np.float32)], "missing_samples", "must carry the sender's sample ids"),
    ([np.ones(4, dtype=np.float32), IDS.astype(np.float32)], "bad_samples", "float32 [3], expected int64"),
    ([np.ones(4, dtype=np.float32), np.arange(9, dtype=np.int64)], "bad_samples", "expected int64 [<= 8]"),
    ([np.ones(4, dtype=np.float32), np.array([1, 100], dtype=np.int64)], "bad_samples", "outside [0, 100)"),
    ([np.ones(4, dtype=np.float32), np.array([-1], dtype=np.int64)], "bad_samples", "min -1"),
])
def test_a_collective_payload_of_the_wrong_dtype_shape_length_or_values_is_rejected(arrays, reason, words):
    e = rejected(parse_coll_part, part(GOOD_PART, arrays), LIM)
    assert e.reason == reason, e
    assert words in e.detail, e.detail


def test_int8_parts_are_scaled_and_a_scale_that_could_overflow_float32_is_rejected():
    lim = CollLimits(compression="int8", part_elems=4, max_total=10)
    q = np.array([127, -127, 3, 0], dtype=np.int8)
    p = parse_coll_part(part({**GOOD_PART, "scale": 0.5}, [q]), lim)
    assert p.values.tolist() == [63.5, -63.5, 1.5, 0.0]
    e = rejected(parse_coll_part, part({**GOOD_PART, "scale": 1e37}, [q]), lim)
    assert e.reason == "bad_field" and "outside (0, 1e+30)" in e.detail  # 127 * 1e37 is inf in float32
    big = parse_coll_part(part({**GOOD_PART, "scale": 9.9e29}, [q]), lim)
    assert np.isfinite(big.values).all()


# ------------------------------------------------------------------------------------- state chunks
def test_a_state_chunk_announcing_a_huge_total_or_an_offset_outside_it_is_rejected():
    good = {"total": 10, "offset": 0, "sha256": "cd" * 32, "params_hash": "p", "round": 3}
    data = [np.zeros(10, dtype=np.uint8)]
    c = parse_state_chunk(wire("state_chunk", good, src="a", arrays=data), 1 << 20)
    assert (c.total, c.offset, c.round, c.samples_sha256) == (10, 0, 3, None)
    for change, words in [({"total": 2**40}, "'total' = 1099511627776 is outside [1, 1048577)"),
                          ({"offset": 10}, "'offset' = 10 is outside [0, 10)"),
                          ({"sha256": "x"}, "'sha256' = 'x' is not of the form"),
                          ({"round": float("inf")}, "'round' must be an integer")]:
        e = rejected(parse_state_chunk, wire("state_chunk", {**good, **change}, src="a", arrays=data), 1 << 20)
        assert words in e.detail, e.detail
    e = rejected(parse_state_chunk, wire("state_chunk", {**good, "offset": 5}, src="a", arrays=data), 1 << 20)
    assert e.reason == "bad_payload" and "does not fit a state of 10 bytes" in e.detail
