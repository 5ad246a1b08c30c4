"""Checked reads of a message body's fields, as a site reads every body it is sent.

A body that does not fit raises `Rejected` with a short machine-readable `reason` and a precise
`detail` (field, what was expected, what came); nothing here raises anything else on bad input.
Shared by the site's parsers (site_agent/messages.py) and the epoch plan's decoder (ground/plans.py).
"""

from __future__ import annotations

import re
from typing import Any

MAX_INT = 2**62  # rounds, cursors, epochs, offsets: anything larger is not a real value
HEX64 = re.compile(r"[0-9a-f]{64}")
HEX_DIGEST = re.compile(r"[0-9a-f]{1,128}")  # a parameter hash as round reports carry it
NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class Rejected(ValueError):
    """A message body that does not fit its type; `reason` is a short code, `detail` says exactly why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# ----------------------------------------------------------------------------- field checks
def field(body: dict[str, Any], key: str, what: str) -> Any:
    if key not in body:
        raise Rejected("missing_field", f"{what} body lacks field {key!r}")
    return body[key]


def req_int(body: dict[str, Any], key: str, what: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """An int field (never a bool, a float or a string) with lo <= value < hi."""
    v = field(body, key, what)
    if not isinstance(v, int) or isinstance(v, bool):
        raise Rejected("bad_field", f"{what} field {key!r} must be an integer, got {type(v).__name__} {show(v)}")
    if not lo <= v < hi:
        raise Rejected("bad_field", f"{what} field {key!r} = {show(v)} is outside [{lo}, {hi})")
    return v


def req_bool(body: dict[str, Any], key: str, what: str, default: bool | None = None) -> bool:
    if key not in body and default is not None:
        return default
    v = field(body, key, what)
    if not isinstance(v, bool):
        raise Rejected("bad_field", f"{what} field {key!r} must be a boolean, got {type(v).__name__} {show(v)}")
    return v


def opt_str(body: dict[str, Any], key: str, what: str, pattern: re.Pattern[str] | None = None) -> str | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or (pattern is not None and not pattern.fullmatch(v)):
        raise Rejected("bad_field", f"{what} field {key!r} = {show(v)} is not "
                                    f"{'a string' if pattern is None else 'of the form ' + pattern.pattern}")
    return v


def names(body: dict[str, Any], key: str, what: str, known: frozenset[str], required: bool = True) -> tuple[str, ...]:
    v = field(body, key, what) if required else body.get(key, [])
    if v is None and not required:
        v = []
    if not isinstance(v, list) or len(v) > 1024:
        raise Rejected("bad_field", f"{what} field {key!r} must be a list of site names, got {show(v)}")
    bad = [x for x in v if not isinstance(x, str) or not NAME.fullmatch(x)]
    if bad:
        raise Rejected("bad_field", f"{what} field {key!r} holds non-names {show(bad)}")
    if len(set(v)) != len(v):
        raise Rejected("bad_field", f"{what} field {key!r} names a site twice: {show(v)}")
    unknown = sorted(set(v) - known) if known else []
    if unknown:
        raise Rejected("unknown_site", f"{what} field {key!r} names {unknown}, not sites of this cluster "
                                       f"{sorted(known)}")
    return tuple(sorted(v))


def show(v: Any, limit: int = 80) -> str:
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
        return "[" + ", ".join(show(x, 20) for x in v[:5]) + (", ..." if len(v) > 5 else "") + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{show(k, 20)}: ..." for k in list(v)[:5]) + "}"
    return f"<{type(v).__name__}>"
