"""How a study's decision is worded, the same on every page and note (standard library only: the
published page is built without numpy)."""

from __future__ import annotations

from typing import Any


def passed_as_written(gates: list[dict[str, Any]]) -> str:
    """One wording for every page and note: gates that passed as written count whether or not they are
    vacuous, and how many of them are is said beside it ("2 of 2 gates passed as written, 2 of them vacuous")."""
    passed = [g for g in gates if g["status"] == "pass"]
    vac = [g["name"] for g in passed if g["vacuous"]]
    return (f"{len(passed)} of {len(gates)} gates passed as written"
            + (f", {len(vac)} of them vacuous ({', '.join(vac)})" if vac else ""))
