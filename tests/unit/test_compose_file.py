"""The compose cluster, checked without a Docker engine: the native and compose topologies agree, ports
agree with the topology, the commands parse with the real parser, the image copies every package, and
every site reaches every other process only through a Toxiproxy proxy. The rest of the compose file's
checks: tests/live/test_compose_file.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ground.topology import (COMPOSE_BIND_PORT, COMPOSE_TOXIPROXY, COMPOSE_TOXIPROXY_API_PORT, COORD, STORE, Topology,
                             link_map, plan_topology, service_name)
from xdc.compose import API_ALIAS, API_NETWORK, API_RELAY, CONTROL_NETWORK, TOXIPROXY_API, network_name
from tests.helpers_compose_file import SITES, _env_default, _xdc_commands, doc  # noqa: F401  (doc: the fixture)


def test_native_and_compose_link_maps_are_identical() -> None:
    native = plan_topology(SITES, "native", ports={p: 5000 + i for i, p in enumerate((COORD, STORE, *SITES))})
    compose = plan_topology(SITES, "compose")
    assert link_map(native) == link_map(compose)
    assert list(native.links) == list(compose.links) == [n for n, _, _ in Topology.link_names(SITES)]
    assert len(compose.links) == 3 * 2 + 3 * 2
    assert set(native.binds) == set(compose.binds) == {COORD, STORE, *SITES}
    # the same link -> the same server, addressed the way each mode reaches it
    for name, link in compose.links.items():
        assert link.upstream == f"{service_name(link.server)}:{COMPOSE_BIND_PORT}"
        assert native.links[name].upstream == native.binds[link.server]
        assert link.listen.startswith(f"{COMPOSE_TOXIPROXY}:")
        assert link.proxy_listen == "0.0.0.0:" + link.listen.rsplit(":", 1)[1]
    assert len({l.listen for l in compose.links.values()}) == len(compose.links)


def test_the_commands_parse_with_the_real_parser(doc: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command line reaches its handler with the right arguments (handlers replaced)."""
    import xdc.cli as cli

    seen: dict[str, object] = {}
    for h in ("cmd_prepare", "cmd_process", "cmd_finish"):
        monkeypatch.setattr(cli, h, lambda args, _h=h: seen.__setitem__(_h, args) or 0)
    for name, argv in _xdc_commands(doc).items():
        seen.clear()
        assert cli.main(argv[1:]) == 0, name
        (args,) = seen.values()
        run_dir = getattr(args, "run_dir", None) or getattr(args, "run", None) or (getattr(args, "paths", None) or [None])[0]
        assert str(run_dir) == "/runs/compose-run", name
        if name.startswith("site-"):
            assert args.site == name.removeprefix("site-")
    seen.clear()
    cli.main(_xdc_commands(doc)["init"][1:])
    args = seen["cmd_prepare"]
    assert args.topology == "compose" and args.toxiproxy == TOXIPROXY_API == f"{API_ALIAS}:{COMPOSE_TOXIPROXY_API_PORT}"
    assert args.sites.split(",") == list(SITES)


def test_ports_agree_with_the_topology(doc: dict) -> None:
    topo = plan_topology(SITES, "compose")
    tp = doc["services"][COMPOSE_TOXIPROXY]
    # the API listens on the control network's address only (its alias there), never on 0.0.0.0
    assert f"-port={COMPOSE_TOXIPROXY_API_PORT}" in tp["command"] and f"-host={API_ALIAS}" in tp["command"]
    assert tp["networks"][CONTROL_NETWORK] == {"aliases": [API_ALIAS]}
    assert all(not v for n, v in tp["networks"].items() if n != CONTROL_NETWORK)  # the alias nowhere else
    assert API_ALIAS in " ".join(tp["healthcheck"]["test"])
    assert topo.toxiproxy_api == f"{COMPOSE_TOXIPROXY}:{COMPOSE_TOXIPROXY_API_PORT}"
    assert sorted(int(p) for p in tp["expose"]) == sorted(int(l.listen.rsplit(":", 1)[1]) for l in topo.links.values())
    # only the Toxiproxy API is published, on loopback, through the relay; no process is reachable from outside
    relay = doc["services"][API_RELAY]
    assert [_env_default(p) for p in relay["ports"]] == [f"127.0.0.1:{COMPOSE_TOXIPROXY_API_PORT}:{COMPOSE_TOXIPROXY_API_PORT}"]
    assert relay["command"][-2:] == ["--to", TOXIPROXY_API] and "volumes" not in relay
    for n, s in doc["services"].items():
        if n != API_RELAY:
            assert "ports" not in s, n
    assert set(topo.binds.values()) == {f"0.0.0.0:{COMPOSE_BIND_PORT}"}


def test_every_site_reaches_every_other_only_through_toxiproxy(doc: dict) -> None:
    svcs = doc["services"]
    topo = plan_topology(SITES, "compose")
    nets = {n: set(s.get("networks", ())) for n, s in svcs.items()}
    procs = topo.processes()
    assert set(doc["networks"]) == {network_name(p) for p in procs} | {CONTROL_NETWORK, API_NETWORK}
    assert nets[COMPOSE_TOXIPROXY] == set(doc["networks"]) - {API_NETWORK}
    # no route out of a process's network, nor out of the control network (Toxiproxy's API, init and
    # finish); the one network with a gateway carries only the relay of the API to the host's loopback
    for p in procs:
        assert doc["networks"][network_name(p)] == {"internal": True}
    assert doc["networks"][CONTROL_NETWORK] == {"internal": True}
    assert [n for n, s in svcs.items() if API_NETWORK in s.get("networks", ())] == [API_RELAY]
    assert sorted(n for n, s in svcs.items() if CONTROL_NETWORK in s.get("networks", ())) == sorted(
        [COMPOSE_TOXIPROXY, API_RELAY, "init", "finish"])
    for p in procs:
        assert nets[service_name(p)] == {network_name(p)}
    for p in procs:
        for q in procs:
            if p != q:  # no network in common: p cannot even resolve q's name, only toxiproxy's
                assert not nets[service_name(p)] & nets[service_name(q)], (p, q)
    # and what each process dials is a proxy on toxiproxy, for every peer it has
    for s in SITES:
        routes = topo.routes_for(s)
        assert {r.peer for r in routes} == {*(x for x in SITES if x != s), COORD, STORE}
        for r in routes:
            assert r.address.startswith(f"tcp://{COMPOSE_TOXIPROXY}:")


def test_the_image_copies_every_package_the_project_installs() -> None:
    """The image runs `pip install /app`: a package pyproject lists but the Dockerfile does not copy
    fails that build (the compose smoke's build failed this way when ground/, control/, telemetry/ and
    studies/ were added)."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    copied = set(re.findall(r"^COPY (\S+) /app/\1$", (root / "compose" / "Dockerfile").read_text(), flags=re.M))
    missing = sorted(set(packages) - copied)
    assert not missing, f"compose/Dockerfile does not COPY {missing} into /app"
