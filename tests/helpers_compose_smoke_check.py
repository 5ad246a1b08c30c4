"""compose/netprobe.py loaded by path (compose/ is not a package), for tests/unit/test_compose_smoke_check.py
and tests/live/test_compose_smoke_check.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"compose_{name}", ROOT / "compose" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


netprobe = _load("netprobe")
