"""What a checker returns (analysis/checkers.py): pass / fail / unknown, with its evidence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
MAX_EVIDENCE = 20  # lines of evidence kept per checker (the count says how many there were)


@dataclass
class CheckResult:
    name: str
    status: str
    summary: str
    evidence: list[str] = field(default_factory=list)
    n_violations: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _result(name: str, violations: list[str], ok_summary: str, fail_summary: str,
            notes: list[str] | None = None, missing: list[str] | None = None) -> CheckResult:
    """fail on any violation; else unknown if evidence was missing (naming it); else pass."""
    if violations:
        return CheckResult(name, FAIL, fail_summary.format(n=len(violations)), violations[:MAX_EVIDENCE],
                           len(violations))
    if missing:
        missing = list(dict.fromkeys(missing))
        return CheckResult(name, UNKNOWN, f"cannot tell: {len(missing)} piece(s) of evidence missing "
                           f"(first: {missing[0]})", missing[:MAX_EVIDENCE])
    return CheckResult(name, PASS, ok_summary, (notes or [])[:MAX_EVIDENCE], 0)
