"""Located field checks for hand-written trees (scenarios, study protocols): every error names the
file, the line and the dotted field. `FieldChecker` knows nothing of what it checks; the scenario
validator (chaos/scenario_check.py) and the protocol validator (studies/protocol.py) build on it."""

from __future__ import annotations

import difflib
import math
from typing import Any, Iterable, Mapping

from chaos.fault_parts import ScenarioError

FieldPath = tuple[Any, ...]  # keys and list indices from the root, e.g. ("faults", 0, "kind")


def dotted(path: FieldPath) -> str:
    """("faults", 0, "kind") -> "faults[0].kind"."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def tname(v: Any) -> str:
    """What a value is, in the words an error message uses."""
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(v), type(v).__name__)


class FieldChecker:
    """The checks every located validator shares. `lines` maps a field path to its line in the source
    (empty for a tree built in code); `err` makes the error a caller raises (override it for another
    error type)."""

    def __init__(self, source: str, lines: Mapping[FieldPath, int]) -> None:
        self.source = source
        self.lines = lines

    def line(self, path: FieldPath) -> int | None:
        """The line of the path, or of its nearest ancestor that has one."""
        p = tuple(path)
        while True:
            if p in self.lines:
                return self.lines[p]
            if not p:
                return None
            p = p[:-1]

    def err(self, path: FieldPath, reason: str) -> Exception:
        return ScenarioError(self.source, self.line(path), dotted(path), reason)

    def mapping(self, v: Any, path: FieldPath, what: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            raise self.err(path, f"expected {what} (a mapping), got {tname(v)}")
        return v

    def unknown(self, d: Mapping[str, Any], known: Iterable[str], path: FieldPath) -> None:
        known = list(known)
        for k in d:
            if k not in known:
                hint = difflib.get_close_matches(str(k), known, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise self.err((*path, k), f"unknown field{extra}; known: {known}")

    def number(self, v: Any, path: FieldPath, *, minimum: float | None = 0, exclusive: bool = False,
               integer: bool = False, what: str = "a number") -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise self.err(path, f"expected {what}, got {tname(v)} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.err(path, f"expected a finite number, got {v!r}")
        if minimum is not None and (v < minimum or (exclusive and v == minimum)):
            raise self.err(path, f"must be {'>' if exclusive else '>='} {minimum:g}, got {v!r}")
        return v
