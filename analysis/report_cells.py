"""HTML building blocks shared by the report's sections: an evidence badge, a number cell that
carries its evidence class, a run's key (for element ids and trace file names), a Plotly figure
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


def run_key(run: dict[str, Any]) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", run["run_id"])


def fig_html(fig: Any, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})
