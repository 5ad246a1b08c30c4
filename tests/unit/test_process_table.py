"""The compose generator, the topology and the byte ledger all take the cluster's processes from the
one table (ground/processes.py): none keeps a list of its own. The launcher's start and stop order:
tests/live/test_process_table.py."""

from __future__ import annotations

from analysis.ledgers import byte_ledger
from ground.processes import PROCESSES, compose_processes, has_byte_counters, wan_processes
from ground.topology import plan_topology, service_name
from xdc.compose import compose_spec
from tests.helpers_process_table import SITES


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
