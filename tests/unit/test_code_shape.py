"""The code's shape, measured from the files: no module of the packages over 500 lines (tests/ and
bench/ aside), and the simulator names no site behaviour it copies ("as the agent"): what it
shares with the agent it imports (site_core/, ground/)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.glob("*/**/*.py")
                  if p.relative_to(ROOT).parts[0] not in {"tests", "bench", ".venv", "runs", "results"}
                  and not p.relative_to(ROOT).parts[0].startswith("."))


def test_no_module_of_the_packages_is_over_500_lines():
    mods = _modules()
    assert len(mods) > 100
    long = {str(p.relative_to(ROOT)): n for p in mods if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_simulator_names_no_copy_of_the_agent():
    pattern = re.compile(r"\bas (the agent|site_agent)", re.IGNORECASE)
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "sim").glob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
