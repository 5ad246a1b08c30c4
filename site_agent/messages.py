"""Typed control and collective messages a site accepts, and the parsers that check every body.

A site trusts no body: whatever arrives (from the coordinator, a peer, or an insider holding a
cluster key) is parsed here into a frozen dataclass before any field is used. A body that does
not fit raises `Rejected` with a short machine-readable `reason` and a precise `detail`; the
caller logs it as `message_rejected` and carries on. Nothing here raises anything else on bad
input (no `OverflowError` from an infinite float, no `MemoryError` from a huge length).

    membership  -> EpochPlan  (ground/plans.py; only from the coordinator; body epoch == header epoch)
    shutdown    -> Shutdown   (only from the coordinator)
    coll        -> CollPart   (structure and numbers; the round's shard sizes are checked by the collective)
    state_chunk -> StateChunk (bounded total, in-range offset, byte buffer)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ground.fields import HEX64 as _HEX64
from ground.fields import MAX_INT, Rejected, req_int
from ground.fields import field as _field
from ground.fields import opt_str as _opt_str
from ground.fields import show as _show
from ground.plans import EpochPlan
from wan.frames import Message

MAX_SCALE = 1e30  # an int8 part's scale: 127 * scale stays finite in float32
PHASES = ("rs", "ag")
PAYLOAD_DTYPES = {"none": "float32", "fp16": "float16", "int8": "int8"}


# ----------------------------------------------------------------------------- control messages
@dataclass(frozen=True)
class Shutdown:
    """The coordinator ends the run (the body of a `shutdown` message)."""

    epoch: int
    reason: str


def parse_plan(msg: Message, sites: frozenset[str], coordinator: str) -> EpochPlan:
    """A `membership` message as the typed EpochPlan (ground/plans.py); Rejected (with why) if anything
    in it does not fit."""
    if msg.src != coordinator:
        raise Rejected("not_coordinator", f"membership from {msg.src!r}: only {coordinator!r} announces epochs")
    return EpochPlan.from_body(msg.body, msg.epoch, sites)


def parse_shutdown(msg: Message, coordinator: str) -> Shutdown:
    if msg.src != coordinator:
        raise Rejected("not_coordinator", f"shutdown from {msg.src!r}: only {coordinator!r} ends the run")
    reason = msg.body.get("reason", "")
    if not isinstance(reason, str):
        raise Rejected("bad_field", f"shutdown field 'reason' must be a string, got {_show(reason)}")
    return Shutdown(epoch=msg.epoch, reason=reason[:200])


# ----------------------------------------------------------------------------- collective parts
@dataclass(frozen=True)
class CollLimits:
    """What a collective part may hold: set once from the model and the schedule."""

    compression: str = "none"
    part_elems: int = 1 << 16  # values per part (the sender cuts at this size)
    max_total: int = 1 << 31  # values in one shard: at most the model's flat size
    attest: bool = False  # rs parts at offset 0 must carry the sender's sample ids of the round
    max_samples: int = 1 << 16  # sample ids one site trains in one round
    sample_id_limit: int = MAX_INT  # ids are in [0, sample_id_limit)


@dataclass(frozen=True)
class CollPart:
    """One validated part of a collective: float32 values (decompressed) and, maybe, the sender's ids."""

    epoch: int
    round: int
    phase: str
    shard: int
    offset: int
    total: int
    src: str
    values: np.ndarray  # float32 [size], finite
    samples: np.ndarray | None  # int64 [k]: the sender's sample ids of this round (rs, offset 0)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + (0 if self.samples is None else self.samples.nbytes))


def parse_coll_part(msg: Message, lim: CollLimits) -> CollPart:
    """A `coll` message as a CollPart; Rejected if any field, the payload or the ids do not fit."""
    b, what = msg.body, "collective part"
    rnd = req_int(b, "round", what)
    phase = _field(b, "phase", what)
    if phase not in PHASES:
        raise Rejected("bad_field", f"{what} field 'phase' = {_show(phase)}, expected one of {list(PHASES)}")
    shard = req_int(b, "shard", what, hi=4096)
    total = req_int(b, "total", what, hi=lim.max_total + 1)
    offset = req_int(b, "offset", what, hi=max(total, 1))
    if offset % lim.part_elems:
        raise Rejected("bad_field", f"{what} offset {offset} is not a multiple of the part size {lim.part_elems}")
    scale = _scale(b, what)
    values = _payload(msg, lim, offset, total, scale)
    samples = _samples(msg, lim) if lim.attest and phase == "rs" and offset == 0 else None
    return CollPart(epoch=msg.epoch, round=rnd, phase=phase, shard=shard, offset=offset, total=total, src=msg.src,
                    values=values, samples=samples)


def _scale(b: dict[str, Any], what: str) -> float:
    v = _field(b, "scale", what)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise Rejected("bad_field", f"{what} field 'scale' must be a number, got {type(v).__name__}")
    try:
        s = float(v)
    except OverflowError:
        raise Rejected("bad_field", f"{what} field 'scale' = {_show(v)} does not fit a float") from None
    if not math.isfinite(s):
        raise Rejected("non_finite", f"{what} field 'scale' = {s!r} is not a finite number")
    if not 0.0 < s < MAX_SCALE:
        raise Rejected("bad_field", f"{what} field 'scale' = {s!r} is outside (0, {MAX_SCALE:g})")
    return s


def _payload(msg: Message, lim: CollLimits, offset: int, total: int, scale: float) -> np.ndarray:
    if not msg.buf_meta:
        raise Rejected("bad_payload", "collective part carries no payload buffer")
    dtype, shape = msg.buf_meta[0]
    want = PAYLOAD_DTYPES.get(lim.compression, "float32")
    if dtype != want:
        raise Rejected("bad_payload", f"payload dtype {dtype}, this cluster sends {want} "
                                      f"(compression {lim.compression!r})")
    size = min(lim.part_elems, total - offset) if total else 0
    if len(shape) != 1 or shape[0] != size:
        raise Rejected("bad_payload", f"payload shape {list(shape)} at offset {offset} of {total}: expected [{size}]")
    raw = msg.array(0)
    if raw.dtype == np.int8:
        vals = raw.astype(np.float32) * np.float32(scale)
    else:
        if scale != 1.0:
            raise Rejected("bad_field", f"scale {scale!r} on a {dtype} payload (only int8 parts are scaled)")
        # No copy: the view keeps the received frame alive, and the caller copies the values into
        # its shard buffer anyway (a second 1 MiB copy per part was ~0.2 ms of CPU each).
        vals = raw.astype(np.float32, copy=False)
    if vals.size and not np.isfinite(vals).all():
        bad = int(vals.size - np.count_nonzero(np.isfinite(vals)))
        raise Rejected("non_finite", f"payload holds {bad} infinite or NaN value(s) of {vals.size}")
    return vals


def _samples(msg: Message, lim: CollLimits) -> np.ndarray:
    if len(msg.buf_meta) < 2:
        raise Rejected("missing_samples", "the first reduce-scatter part of a round must carry the sender's "
                                          "sample ids (buffer 1)")
    dtype, shape = msg.buf_meta[1]
    if dtype != "int64" or len(shape) != 1 or shape[0] > lim.max_samples:
        raise Rejected("bad_samples", f"sample ids are {dtype} {list(shape)}, expected int64 [<= {lim.max_samples}]")
    ids = np.array(msg.array(1), dtype=np.int64)  # a copy: the frame's memory is not ours to keep
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= lim.sample_id_limit):
        raise Rejected("bad_samples", f"sample ids outside [0, {lim.sample_id_limit}): "
                                      f"min {int(ids.min())}, max {int(ids.max())}")
    return ids


# ----------------------------------------------------------------------------- state transfer
@dataclass(frozen=True)
class StateChunk:
    """One chunk of a donor's packed state."""

    src: str
    epoch: int
    offset: int
    total: int
    sha256: str
    round: int
    params_hash: str
    samples_sha256: str | None
    data: np.ndarray  # uint8 [size]


def parse_state_chunk(msg: Message, max_total: int) -> StateChunk:
    b, what = msg.body, "state chunk"
    total = req_int(b, "total", what, lo=1, hi=max_total + 1)
    offset = req_int(b, "offset", what, hi=total)
    sha = _opt_str(b, "sha256", what, _HEX64)
    phash = _opt_str(b, "params_hash", what)
    if sha is None or phash is None:
        raise Rejected("missing_field", f"{what} lacks 'sha256' or 'params_hash'")
    if not msg.buf_meta:
        raise Rejected("bad_payload", f"{what} carries no buffer")
    dtype, shape = msg.buf_meta[0]
    if dtype != "uint8" or len(shape) != 1 or offset + shape[0] > total or shape[0] == 0:
        raise Rejected("bad_payload", f"{what} buffer {dtype} {list(shape)} at offset {offset} does not fit "
                                      f"a state of {total} bytes")
    return StateChunk(src=msg.src, epoch=msg.epoch, offset=offset, total=total, sha256=sha,
                      round=req_int(b, "round", what), params_hash=phash,
                      samples_sha256=_opt_str(b, "samples_sha256", what, _HEX64), data=msg.array(0))
