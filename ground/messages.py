"""Typed bodies of the messages the coordinator receives, each checked before any field is trusted.

The WAN layer (`wan/frames.py`) guarantees a well-formed header: run, epoch, src, kind are of the
right types and the sender is a cluster member. The body is whatever the sender put there. Every
kind the coordinator handles has a frozen dataclass here whose `from_body` checks each field's
type and range and raises `BadMessage` with a precise reason (field, what was expected, what came)
for anything else: a string where a round is expected, a missing field, NaN or infinity, a
negative or absurd number, a list of the wrong type or length. The coordinator logs the reason and
drops the message; nothing in a body can stop it.

The helpers (`get_int`, `get_float`, ...) are shared with the checkpoint store's requests.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

# Numbers past these are absurd for any run this emulator can hold (2^53: exact as a float too).
MAX_COUNT = 1 << 53
MAX_FLOAT = 1e30
MAX_TEXT = 2000  # characters of free text (a reason, a detail) kept from a body
MAX_NAME = 128
MAX_SAMPLE_IDS = 1 << 20  # sample ids one round report may carry
MAX_METRICS = 32  # keys of one telemetry body
HEX = re.compile(r"[0-9a-f]{1,128}")
SHA256 = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MISSING = object()


class BadMessage(ValueError):
    """A body that does not match its typed message; `reason` says exactly why."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


def _show(v: Any) -> str:
    """A short rendering of a bad value for a log line (never the whole of a huge input)."""
    if isinstance(v, (dict, list, tuple)):
        return f"a {type(v).__name__} of {len(v)} item(s)"
    if isinstance(v, str):
        return repr(v[:40] + ("..." if len(v) > 40 else ""))
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_COUNT:
        return f"an integer of {len(str(abs(v)))} digits"
    return repr(v)[:60]


def _typed(v: Any) -> str:
    """What a value of the wrong type was, for a reason: "str 'x'", "a dict of 2 item(s)"."""
    if isinstance(v, (dict, list, tuple)):
        return _show(v)
    return f"{type(v).__name__} {_show(v)}"


def body_of(kind: str, body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BadMessage(kind, f"body is {type(body).__name__}, expected a map")
    return body


def _get(kind: str, body: Mapping[str, Any], name: str, default: Any) -> tuple[bool, Any]:
    """(present, value): a missing field is an error unless a default is given."""
    v = body.get(name, _MISSING)
    if v is _MISSING:
        if default is _MISSING:
            raise BadMessage(kind, f"missing field {name!r}")
        return False, default
    return True, v


def get_int(kind: str, body: Mapping[str, Any], name: str, *, lo: int = 0, hi: int = MAX_COUNT,
            default: Any = _MISSING) -> Any:
    """An integer in [lo, hi] (bool is not an integer here); `default` when absent (if given)."""
    v = body.get(name)
    if type(v) is int and lo <= v <= hi:  # the common case first (every message has several)
        return v
    present, v = _get(kind, body, name, default)
    if not present or (v is None and default is None):
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadMessage(kind, f"field {name!r} must be an integer, got {_typed(v)}")
    if not lo <= v <= hi:
        raise BadMessage(kind, f"field {name!r} = {_show(v)} is outside [{lo}, {hi}]")
    return v


def get_float(kind: str, body: Mapping[str, Any], name: str, *, lo: float = 0.0, hi: float = MAX_FLOAT,
              default: Any = _MISSING) -> Any:
    """A finite number in [lo, hi] (an integer is accepted and returned as a float)."""
    present, v = _get(kind, body, name, default)
    if not present or (v is None and default is None):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadMessage(kind, f"field {name!r} must be a number, got {_typed(v)}")
    try:
        f = float(v)
    except OverflowError:
        raise BadMessage(kind, f"field {name!r} = {_show(v)} does not fit a float") from None
    if not math.isfinite(f):
        raise BadMessage(kind, f"field {name!r} must be finite, got {f}")
    if not lo <= f <= hi:
        raise BadMessage(kind, f"field {name!r} = {f} is outside [{lo}, {hi}]")
    return f


def get_str(kind: str, body: Mapping[str, Any], name: str, *, pattern: re.Pattern[str] | None = None,
            max_len: int = MAX_TEXT, default: Any = _MISSING, what: str = "") -> Any:
    present, v = _get(kind, body, name, default)
    if not present or (v is None and default is None):
        return v
    if not isinstance(v, str):
        raise BadMessage(kind, f"field {name!r} must be a string, got {_typed(v)}")
    if len(v) > max_len:
        raise BadMessage(kind, f"field {name!r} is {len(v)} characters, limit {max_len}")
    if pattern is not None and not pattern.fullmatch(v):
        raise BadMessage(kind, f"field {name!r} = {_show(v)} is not {what or pattern.pattern}")
    return v


def get_bool(kind: str, body: Mapping[str, Any], name: str, *, default: Any = _MISSING) -> Any:
    present, v = _get(kind, body, name, default)
    if not present or (v is None and default is None):
        return v
    if not isinstance(v, bool):
        raise BadMessage(kind, f"field {name!r} must be true or false, got {_typed(v)}")
    return v


def get_int_list(kind: str, body: Mapping[str, Any], name: str, *, max_len: int, lo: int = 0,
                 hi: int = MAX_COUNT, default: Any = _MISSING) -> Any:
    present, v = _get(kind, body, name, default)
    if not present or (v is None and default is None):
        return v
    if not isinstance(v, list):
        raise BadMessage(kind, f"field {name!r} must be a list of integers, got {_typed(v)}")
    if len(v) > max_len:
        raise BadMessage(kind, f"field {name!r} has {len(v)} items, limit {max_len}")
    # The common case at C speed (a round's sample ids: hundreds per report); the loop names the first bad item.
    if not v or (set(map(type, v)) == {int} and lo <= min(v) and max(v) <= hi):
        return tuple(v)
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise BadMessage(kind, f"field {name!r}[{i}] = {_show(x)} is not an integer in [{lo}, {hi}]")
    return tuple(v)


# ------------------------------------------------------------------------------ the messages
@dataclass(frozen=True)
class Join:
    pid: int | None
    rejoin: bool

    @staticmethod
    def from_body(body: Any) -> Join:
        b = body_of("join", body)
        return Join(get_int("join", b, "pid", lo=1, hi=(1 << 31) - 1, default=None),
                    get_bool("join", b, "rejoin", default=False))


@dataclass(frozen=True)
class Heartbeat:
    sent_mono_ns: int | None
    epoch: int  # the epoch the site is in (0 before its first)
    round: int

    @staticmethod
    def from_body(body: Any) -> Heartbeat:
        b = body_of("heartbeat", body)
        return Heartbeat(get_int("heartbeat", b, "sent_mono_ns", default=None),
                         get_int("heartbeat", b, "epoch", default=0),
                         get_int("heartbeat", b, "round", lo=-1, default=-1))


@dataclass(frozen=True)
class RoundDone:
    round: int
    step: int
    param_hash: str
    cursor_start: int
    cursor_end: int
    tokens: int
    flops: float
    samples: tuple[int, ...]

    @staticmethod
    def from_body(body: Any) -> RoundDone:
        k = "round_done"
        b = body_of(k, body)
        r = RoundDone(get_int(k, b, "round"), get_int(k, b, "step"),
                      get_str(k, b, "param_hash", pattern=HEX, max_len=128, what="a hex digest"),
                      get_int(k, b, "cursor_start"), get_int(k, b, "cursor_end"), get_int(k, b, "tokens"),
                      get_float(k, b, "flops"), get_int_list(k, b, "samples", max_len=MAX_SAMPLE_IDS, default=()))
        if r.cursor_end < r.cursor_start:
            raise BadMessage(k, f"cursor_end {r.cursor_end} < cursor_start {r.cursor_start}")
        return r


@dataclass(frozen=True)
class SiteDone:
    round: int

    @staticmethod
    def from_body(body: Any) -> SiteDone:
        return SiteDone(get_int("site_done", body_of("site_done", body), "round", lo=-1))


@dataclass(frozen=True)
class Telemetry:
    """Metrics a site ships; kept nested under one field when logged (a key can never collide)."""

    metrics: tuple[tuple[str, float | int | str | bool | None], ...]

    @staticmethod
    def from_body(body: Any) -> Telemetry:
        k = "telemetry"
        b = body_of(k, body)
        if len(b) > MAX_METRICS:
            raise BadMessage(k, f"{len(b)} metrics, limit {MAX_METRICS}")
        out: list[tuple[str, Any]] = []
        for name in sorted(b):
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise BadMessage(k, f"metric name {_show(name)} is not a short identifier")
            v = b[name]
            if v is None or isinstance(v, bool):
                out.append((name, v))
            elif isinstance(v, int):
                out.append((name, get_int(k, b, name, lo=-MAX_COUNT)))
            elif isinstance(v, float):
                out.append((name, get_float(k, b, name, lo=-MAX_FLOAT)))
            elif isinstance(v, str):
                out.append((name, get_str(k, b, name, max_len=200)))
            else:
                raise BadMessage(k, f"metric {name!r} must be a number, string, bool or null, got {_show(v)}")
        return Telemetry(tuple(out))


@dataclass(frozen=True)
class PreemptNotice:
    grace_s: float | None
    round: int

    @staticmethod
    def from_body(body: Any) -> PreemptNotice:
        k = "preempt_notice"
        b = body_of(k, body)
        return PreemptNotice(get_float(k, b, "grace_s", hi=86_400.0, default=None),
                             get_int(k, b, "round", lo=-1, default=-1))


@dataclass(frozen=True)
class CheckpointDurable:
    manifest_hash: str
    round: int
    cursor: int

    @staticmethod
    def from_body(body: Any) -> CheckpointDurable:
        k = "checkpoint_durable"
        b = body_of(k, body)
        return CheckpointDurable(get_str(k, b, "manifest_hash", pattern=SHA256, max_len=64, what="a sha256"),
                                 get_int(k, b, "round"), get_int(k, b, "cursor"))


@dataclass(frozen=True)
class PeerUnreachable:
    peer: str
    detail: str
    mutual: bool

    @staticmethod
    def from_body(body: Any) -> PeerUnreachable:
        k = "peer_unreachable"
        b = body_of(k, body)
        detail = b.get("detail", "")
        return PeerUnreachable(get_str(k, b, "peer", pattern=NAME, max_len=MAX_NAME, what="a site name"),
                               detail[:MAX_TEXT] if isinstance(detail, str) else _show(detail),
                               get_bool(k, b, "mutual", default=False))


class Built:
    """A body its sender built as the typed message (the simulator, which is its own sender): `parse`
    hands `typed` back without checking it again, which is what a thousand reports a round cost at
    1,000 simulated sites. `extra` holds the fields outside the typed message (a round_done's `cycle`,
    already a control.observations.SiteCycle), `raw` the map a real site would have sent (kept only
    where an input log needs it). No transport makes one (msgpack decodes to maps): a site's bytes are
    always checked."""

    __slots__ = ("typed", "extra", "raw")

    def __init__(self, typed: Any, extra: Mapping[str, Any] | None = None, raw: dict[str, Any] | None = None) -> None:
        self.typed, self.extra, self.raw = typed, extra, raw

    def get(self, name: str, default: Any = None) -> Any:
        """A field outside the typed message (as `dict.get` on the raw body)."""
        return self.extra.get(name, default) if self.extra is not None else default


TYPES: dict[str, Any] = {
    "join": Join, "heartbeat": Heartbeat, "round_done": RoundDone, "site_done": SiteDone, "telemetry": Telemetry,
    "preempt_notice": PreemptNotice, "checkpoint_durable": CheckpointDurable, "peer_unreachable": PeerUnreachable,
}
PARSERS: dict[str, Any] = {kind: typ.from_body for kind, typ in TYPES.items()}


def parse(kind: str, body: Any) -> Any:
    """The typed message of `kind`; BadMessage for an unknown kind or a body that does not match."""
    p = PARSERS.get(kind)
    if p is None:
        raise BadMessage(kind if isinstance(kind, str) else "?", f"unknown message kind {_show(kind)}")
    if type(body) is Built:
        if type(body.typed) is not TYPES[kind]:
            raise BadMessage(kind, f"a built body holds a {type(body.typed).__name__}, not a {TYPES[kind].__name__}")
        return body.typed
    return p(body)
