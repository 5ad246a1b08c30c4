"""The launcher, the compose generator, the topology and the byte ledger all take the cluster's
processes from the one table (ground/processes.py): none keeps a list of its own."""

from __future__ import annotations

import signal

from analysis.ledgers import byte_ledger
from ground.config import load_config
from ground.processes import (PROCESSES, compose_processes, has_byte_counters, start_order, stop_order,
                              wan_processes)
from ground.topology import plan_topology, service_name
from xdc.compose import compose_spec
from cluster.launcher import Launcher

SITES = ("a", "b", "c")


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


def test_compose_services_are_the_tables_composable_processes() -> None:
    services = compose_spec(SITES)["services"]
    table = [service_name(n) for p in compose_processes() for n in p.names(SITES)]
    process_services = [n for n, s in services.items() if s.get("command", [None])[0] == "xdc"
                        and s["command"][1] in {p.cli for p in compose_processes()}]
    assert process_services == table == ["sampler", "store", "coordinator", "site-a", "site-b", "site-c"]
    for p in compose_processes():
        for n in p.names(SITES):
            assert services[service_name(n)]["command"][1:] == [p.cli, "--run-dir", services[service_name(n)]
                                                                ["command"][3], *p.args(n)]


def test_topology_processes_and_links_come_from_the_table() -> None:
    topo = plan_topology(SITES, "compose")
    assert topo.processes() == wan_processes(SITES) == [n for p in PROCESSES if p.binds for n in p.names(SITES)]
    assert set(topo.binds) == set(wan_processes(SITES))
    servers = {l.server for l in topo.links.values()}
    assert servers == set(wan_processes(SITES))


def test_the_byte_ledger_expects_counters_exactly_where_the_table_does() -> None:
    silent = ["launcher", "prepare", "summarize", "chaos", "telemetry", "a.w0", "a.w1", "coord", "store", "b"]
    logs = {p: [{"event": "noted", "pid": 1}] for p in silent}
    missing = byte_ledger(logs, set())["processes_without_counters"]
    assert missing == [p for p in silent if has_byte_counters(p)] == ["coord", "store", "b"]
