"""The committed compose file and the xdc commands it runs, for tests/unit/test_compose_file.py and
tests/live/test_compose_file.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose" / "docker-compose.yml"
SITES = ("a", "b", "c")


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env_default(text: str) -> str:
    """${VAR:-default} -> default (what compose substitutes with no environment)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def _xdc_commands(doc: dict) -> dict[str, list[str]]:
    return {n: [_env_default(a) for a in s["command"]] for n, s in doc["services"].items() if s["command"][0] == "xdc"}
