"""HTML building blocks shared by the report's sections: an evidence badge, a number cell that
carries its evidence class, the evidence class of a run's numbers (read from the artifact), a run's key (for element ids and trace file names), a Plotly figure
as an inline div."""

from __future__ import annotations

import re
from html import escape
from typing import Any


def ev(evidence: str) -> str:
    return f'<span class="ev ev-{escape(evidence)}">{escape(evidence)}</span>'


def num(value: Any, evidence: str = "measured", unit: str = "", fmt: str = ",") -> str:
    """A table cell holding a number and its evidence class."""
    if value is None:
        return f'<td class="num">—{ev("unavailable" if evidence == "measured" else evidence)}</td>'
    text = format(value, fmt) if isinstance(value, (int, float)) else escape(str(value))
    return f'<td class="num">{text}{(" " + escape(unit)) if unit else ""}{ev(evidence)}</td>'


def qcell(qty: dict[str, Any], fmt: str = ",") -> str:
    return num(qty.get("value"), qty.get("evidence", "measured"), qty.get("unit", ""), fmt)


def energy_cell(energy: dict[str, Any]) -> str:
    """The run-level energy cell: the measured joules while their claim stands; otherwise a dash with why
    (no readable meter, or a frozen invalidator withdrew the claim, whose number then stays a diagnostic)."""
    if energy.get("value") is not None and energy.get("claim") in (None, "stands"):
        return qcell(energy, ",.0f")
    why = (f"claim {energy.get('claim')}: a frozen invalidator fired" if energy.get("value") is not None
           else str(energy.get("reason") or "no readable meter"))
    return f"<td class='num' title='{escape(why)}'>—{ev('unavailable')}</td>"


def run_evidence(run: dict[str, Any]) -> str:
    """The evidence class of a run's numbers, from its artifact (a simulated run's are `modeled`), never a
    literal: the class its work counts carry."""
    return ((run.get("metrics") or {}).get("useful_tokens") or {}).get("evidence") or "unavailable"


def runs_evidence(runs: list[dict[str, Any]]) -> str:
    """One class for several runs: theirs when they agree, else `mixed`."""
    classes = {run_evidence(r) for r in runs}
    return classes.pop() if len(classes) == 1 else "mixed"


def art_evidence(art: dict[str, Any]) -> str:
    return runs_evidence(art.get("runs") or [])


def run_key(run: dict[str, Any]) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", run["run_id"])


def fig_html(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
