"""The compose smoke's network probe (compose/netprobe.py) on a real loopback socket. The smoke's
verdicts as pure functions: tests/unit/test_compose_smoke_check.py."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.helpers_compose_smoke_check import netprobe


def test_the_probe_connects_for_real(tmp_path: Path) -> None:
    """A listening loopback port counts as reached; a closed one does not."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert netprobe._connect("127.0.0.1", port, 2.0)["ok"]
    assert not netprobe._connect("127.0.0.1", port, 2.0)["ok"]
