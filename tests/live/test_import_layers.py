"""The import layers declared in pyproject.toml ([tool.importlinter]) hold: `lint-imports` passes.

Run as a subprocess, as `make test` runs it, from the repo root (it reads pyproject.toml there).
No exception is listed in the contracts, so any import running back up a layer fails this test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lint_imports_passes_with_no_exceptions_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert cfg["contracts"], "no import contracts declared"
    assert not any("ignore_imports" in c for c in cfg["contracts"]), "a contract lists exceptions"
    exe = Path(sys.executable).parent / "lint-imports"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([str(exe)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout
