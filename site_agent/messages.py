"""Typed control and collective messages a site accepts, and the parsers that check every body.

A site trusts no body: whatever arrives (from the coordinator, a peer, or an insider holding a
cluster key) is parsed here into a frozen dataclass before any field is used. A body that does
not fit raises `Rejected` with a short machine-readable `reason` and a precise `detail`; the
caller logs it as `message_rejected` and carries on. Nothing here raises anything else on bad
input (no `OverflowError` from an infinite float, no `MemoryError` from a huge length).

    membership  -> Plan       (only from the coordinator; body epoch == header epoch)
    shutdown    -> Shutdown   (only from the coordinator)
    coll        -> CollPart   (structure and numbers; the round's shard sizes are checked by the collective)
    state_chunk -> StateChunk (bounded total, in-range offset, byte buffer)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from control.setting import MODES, ConsistencySetting, SettingError
from wan.frames import Message

MAX_INT = 2**62  # rounds, cursors, epochs, offsets: anything larger is not a real value
MAX_SCALE = 1e30  # an int8 part's scale: 127 * scale stays finite in float32
RESTORES = ("none", "donor", "store")
PHASES = ("rs", "ag")
PAYLOAD_DTYPES = {"none": "float32", "fp16": "float16", "int8": "int8"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class Rejected(ValueError):
    """A message body that does not fit its type; `reason` is a short code, `detail` says exactly why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# ----------------------------------------------------------------------------- field checks
def _field(body: dict[str, Any], key: str, what: str) -> Any:
    if key not in body:
        raise Rejected("missing_field", f"{what} body lacks field {key!r}")
    return body[key]


def req_int(body: dict[str, Any], key: str, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """An int field (never a bool, a float or a string) with lo <= value < hi."""
    v = _field(body, key, what)
    if not isinstance(v, int) or isinstance(v, bool):
        raise Rejected("bad_field", f"{what} field {key!r} must be an integer, got {type(v).__name__} {_show(v)}")
    if not lo <= v < hi:
        raise Rejected("bad_field", f"{what} field {key!r} = {_show(v)} is outside [{lo}, {hi})")
    return v


def _bool(body: dict[str, Any], key: str, what: str, default: bool | None = None) -> bool:
    if key not in body and default is not None:
        return default
    v = _field(body, key, what)
    if not isinstance(v, bool):
        raise Rejected("bad_field", f"{what} field {key!r} must be a boolean, got {type(v).__name__} {_show(v)}")
    return v


def _opt_str(body: dict[str, Any], key: str, what: str, pattern: re.Pattern[str] | None = None) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or (pattern is not None and not pattern.fullmatch(v)):
        raise Rejected("bad_field", f"{what} field {key!r} = {_show(v)} is not "
                                    f"{'a string' if pattern is None else 'of the form ' + pattern.pattern}")
    return v


def _names(body: dict[str, Any], key: str, what: str, known: frozenset[str], required: bool = True) -> tuple[str, ...]:
    v = _field(body, key, what) if required else body.get(key, [])
    if v is None and not required:
        v = []
    if not isinstance(v, list) or len(v) > 1024:
        raise Rejected("bad_field", f"{what} field {key!r} must be a list of site names, got {_show(v)}")
    bad = [x for x in v if not isinstance(x, str) or not _NAME.fullmatch(x)]
    if bad:
        raise Rejected("bad_field", f"{what} field {key!r} holds non-names {_show(bad)}")
    if len(set(v)) != len(v):
        raise Rejected("bad_field", f"{what} field {key!r} names a site twice: {_show(v)}")
    unknown = sorted(set(v) - known) if known else []
    if unknown:
        raise Rejected("unknown_site", f"{what} field {key!r} names {unknown}, not sites of this cluster "
                                       f"{sorted(known)}")
    return tuple(sorted(v))


def _show(v: Any, limit: int = 80) -> str:
    """A bounded repr: never formats a huge or deeply nested value in full."""
    try:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
            return f"<{v.bit_length()}-bit integer>"
        s = repr(v) if isinstance(v, (int, float, bool, type(None))) else _short(v)
    except (RecursionError, ValueError):  # pragma: no cover - defensive
        s = f"<{type(v).__name__}>"
    return s if len(s) <= limit else s[:limit] + "..."


def _short(v: Any) -> str:
    if isinstance(v, str):
        return repr(v[:80])
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x, 20) for x in v[:5]) + (", ..." if len(v) > 5 else "") + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_show(k, 20)}: ..." for k in list(v)[:5]) + "}"
    return f"<{type(v).__name__}>"


# ----------------------------------------------------------------------------- control messages
@dataclass(frozen=True)
class Plan:
    """One membership epoch as the coordinator announced it (the body of a `membership` message)."""

    epoch: int
    members: tuple[str, ...]  # sorted
    paused: bool
    start_round: int
    start_cursor: int
    restore: str  # one of RESTORES
    donor: str | None = None
    joiners: tuple[str, ...] = ()
    manifest_hash: str | None = None
    frontier_manifest: str | None = None
    checkpoint_first: bool = False
    parent_commit: str | None = None
    # The epoch's consistency setting (control.setting; None: a coordinator that sends none, i.e. the
    # run's fixed setting), inner steps before start_round, and the mode of the round before it.
    setting: ConsistencySetting | None = None
    start_step: int | None = None
    prev_mode: str | None = None


@dataclass(frozen=True)
class Shutdown:
    """The coordinator ends the run (the body of a `shutdown` message)."""

    epoch: int
    reason: str


def parse_plan(msg: Message, sites: frozenset[str], coordinator: str) -> Plan:
    """A `membership` message as a Plan; Rejected (with why) if anything in it does not fit."""
    what = "membership"
    if msg.src != coordinator:
        raise Rejected("not_coordinator", f"membership from {msg.src!r}: only {coordinator!r} announces epochs")
    b = msg.body
    epoch = req_int(b, "epoch", what, lo=1)
    if epoch != msg.epoch:
        raise Rejected("epoch_mismatch", f"membership body epoch {epoch} != message epoch {msg.epoch}")
    members = _names(b, "members", what, sites)
    restore = _field(b, "restore", what)
    if restore not in RESTORES:
        raise Rejected("bad_field", f"membership field 'restore' = {_show(restore)}, expected one of {list(RESTORES)}")
    plan = Plan(epoch=epoch, members=members, paused=_bool(b, "paused", what),
                start_round=req_int(b, "start_round", what), start_cursor=req_int(b, "start_cursor", what),
                restore=restore, donor=_opt_str(b, "donor", what, _NAME),
                joiners=_names(b, "joiners", what, sites, required=False),
                manifest_hash=_opt_str(b, "manifest_hash", what, _HEX64),
                frontier_manifest=_opt_str(b, "frontier_manifest", what, _HEX64),
                checkpoint_first=_bool(b, "checkpoint_first", what, default=False),
                parent_commit=_opt_str(b, "parent_commit", what), **_setting_fields(b, what))
    _check_plan(plan)
    return plan


def _setting_fields(b: dict[str, Any], what: str) -> dict[str, Any]:
    """The epoch's consistency setting, start step and previous mode (all or none of them)."""
    if b.get("setting") is None:
        return {}
    try:
        setting = ConsistencySetting.from_json(b["setting"])
    except SettingError as e:
        raise Rejected("bad_field", f"{what} field 'setting': {e}") from None
    prev = _field(b, "prev_mode", what)
    if prev not in MODES:
        raise Rejected("bad_field", f"{what} field 'prev_mode' = {_show(prev)}, expected one of {list(MODES)}")
    return {"setting": setting, "start_step": req_int(b, "start_step", what), "prev_mode": prev}


def _check_plan(p: Plan) -> None:
    if not set(p.joiners) <= set(p.members):
        raise Rejected("inconsistent_plan", f"epoch {p.epoch}: joiners {list(p.joiners)} are not all members "
                                            f"{list(p.members)}")
    if p.restore == "donor" and not p.paused:
        if p.donor is None or p.donor not in p.members or p.donor in p.joiners:
            raise Rejected("inconsistent_plan", f"epoch {p.epoch}: restore by donor needs a donor among the members "
                                                f"who is not a joiner; donor {p.donor!r}, members {list(p.members)}, "
                                                f"joiners {list(p.joiners)}")


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
        vals = raw.astype(np.float32)
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
