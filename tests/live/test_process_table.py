"""The launcher starts and stops the cluster's processes in the one table's order (ground/processes.py).
The other readers of the table: tests/unit/test_process_table.py."""

from __future__ import annotations

import signal

from ground.config import load_config
from ground.processes import start_order, stop_order
from cluster.launcher import Launcher
from tests.helpers_process_table import SITES


class FakeProc:
    """Stands for a Popen: records the signals it gets, in one list shared by every process."""

    def __init__(self, name: str, signals: list[str]) -> None:
        self.name, self.signals, self.returncode = name, signals, None

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        assert sig == signal.SIGTERM
        self.signals.append(self.name)
        self.returncode = 0

    def wait(self, _timeout: float | None = None) -> int:
        return self.returncode or 0

    def kill(self) -> None:
        self.returncode = -9


def _launcher(tmp_path, telemetry: bool) -> Launcher:
    cfg = load_config({"runs_dir": str(tmp_path), "run_id": "t", "cluster": {"sites": list(SITES)},
                       "telemetry": {"enabled": telemetry}})
    return Launcher(cfg, quiet=True)


def test_the_launcher_starts_the_table_in_its_start_order(tmp_path, monkeypatch) -> None:
    ln = _launcher(tmp_path, telemetry=False)  # the hooked sampler, disabled, starts nothing
    spawned: list[tuple[str, str, tuple[str, ...]]] = []
    monkeypatch.setattr(ln, "_spawn", lambda name, module, *extra: spawned.append((name, module, extra)))
    ln._start_all()
    expected = [(n, p.module, p.args(n)) for p in start_order() if not p.hook for n in p.names(SITES)]
    assert spawned == expected
    assert [n for n, _m, _a in spawned] == ["store", "coord", *SITES]  # what the table says today
    assert ("a", "site_agent.agent", ("--site", "a")) in spawned


def test_the_launcher_stops_the_table_in_its_stop_order_the_sampler_last(tmp_path) -> None:
    ln = _launcher(tmp_path, telemetry=True)
    signals: list[str] = []
    names = [n for p in stop_order() for n in p.names(SITES)]
    ln.procs = {n: FakeProc(n, signals) for n in names}  # type: ignore[dict-item]
    ln._stop_all()
    assert signals == names == [*SITES, "coord", "store", "telemetry"]
    assert ln.exit_codes == {n: 0 for n in names}
    assert start_order()[0].name == stop_order()[-1].name == "telemetry"  # first up, last down
