"""The cluster's topology: processes, their bind addresses, and one Toxiproxy proxy per directed link.

Links are named `<client>_to_<server>`: one per ordered pair of sites (`a_to_b`, `b_to_a`, ...)
and one per site-to-service link (`a_to_coord`, `a_to_store`). A process binds only its own
port; every other process reaches it through the proxy of that link, so every
inter-process byte crosses Toxiproxy. The launcher writes the resolved topology to
`<run>/topology.json`; every process reads it from there.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ground.processes import BY_NAME, COORD, STORE, services, wan_processes  # noqa: F401 (COORD, STORE re-exported)

SERVICES = services()  # (COORD, STORE): every site has a link to each


@dataclass(frozen=True)
class Route:
    """How a process reaches `peer`: through proxy `link` listening at `address`."""

    peer: str
    link: str
    address: str  # tcp://host:port of the Toxiproxy listener


@dataclass(frozen=True)
class Link:
    name: str
    client: str
    server: str
    listen: str = ""  # host:port of the Toxiproxy listener (filled in when the proxy exists)
    upstream: str = ""  # host:port the server binds
    # host:port Toxiproxy itself listens on for this link; equal to `listen` on one machine, but
    # "0.0.0.0:<port>" inside the toxiproxy container when clients dial the service name.
    proxy_listen: str = ""


@dataclass(frozen=True)
class Topology:
    sites: tuple[str, ...]
    host: str
    binds: dict[str, str] = field(default_factory=dict)  # process -> host:port it binds
    links: dict[str, Link] = field(default_factory=dict)
    toxiproxy_api: str = ""  # host:port of Toxiproxy's HTTP API

    @staticmethod
    def link_names(sites: tuple[str, ...]) -> list[tuple[str, str, str]]:
        """(name, client, server) for every directed link of the cluster."""
        out = [(f"{a}_to_{b}", a, b) for a in sites for b in sites if a != b]
        out += [(f"{s}_to_{svc}", s, svc) for s in sites for svc in SERVICES]
        return out

    def processes(self) -> list[str]:
        """Every process with WAN links (ground/processes.py), in table order."""
        return wan_processes(self.sites)

    def routes_for(self, name: str) -> list[Route]:
        return [Route(l.server, l.name, f"tcp://{l.listen}") for l in self.links.values() if l.client == name]

    def server_links_for(self, name: str) -> dict[str, str]:
        return {l.client: l.name for l in self.links.values() if l.server == name}

    def bind_for(self, name: str) -> str:
        return f"tcp://{self.binds[name]}"

    def peers_of(self, name: str) -> list[str]:
        """Every process `name` may legitimately hear from."""
        return sorted({l.server for l in self.links.values() if l.client == name}
                      | {l.client for l in self.links.values() if l.server == name})

    def to_json(self) -> dict:
        d = asdict(self)
        d["sites"] = list(self.sites)
        return d

    @staticmethod
    def from_json(d: dict) -> "Topology":
        return Topology(sites=tuple(d["sites"]), host=d["host"], binds=dict(d["binds"]),
                        links={k: Link(**v) for k, v in d["links"].items()}, toxiproxy_api=d.get("toxiproxy_api", ""))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=2, sort_keys=True))

    @staticmethod
    def load(path: str | Path) -> "Topology":
        return Topology.from_json(json.loads(Path(path).read_text()))


# ------------------------------------------------------------------------------ planning
# One definition of the cluster for both ways of running it: `plan_topology` gives the processes,
# their binds and one proxy per directed link; the native launcher fills in free loopback ports,
# compose/docker-compose.yml is generated from the "compose" plan (`xdc compose generate`).

COMPOSE_TOXIPROXY = "toxiproxy"  # the Toxiproxy service's DNS name
COMPOSE_TOXIPROXY_API_PORT = 8474
COMPOSE_BIND_PORT = 7000  # every process binds 0.0.0.0:7000 inside its own container
COMPOSE_PROXY_BASE_PORT = 20000  # proxy i (in `Topology.link_names` order) listens on 20000 + i


def service_name(process: str) -> str:
    """The compose service (and DNS name) of a process: coordinator, store, site-<name>."""
    named = BY_NAME.get(process)
    return named.cli if named is not None and named.cli and not named.per_site else f"site-{process}"


def plan_topology(sites: tuple[str, ...] | list[str], mode: str = "native", *, host: str = "127.0.0.1",
                  ports: dict[str, int] | None = None, proxy_ports: dict[str, int] | None = None) -> Topology:
    """The topology of a cluster before any proxy exists.

    native: every process binds `host:<ports[p]>` (0 when not given); proxy listeners are
        `host:<proxy_ports[link]>`, 0 meaning "Toxiproxy picks a free port" (filled in later).
    compose: every process binds 0.0.0.0:7000 in its container and is reached as
        `<service>:7000`; proxy i listens on 0.0.0.0:(20000+i) in the toxiproxy container and
        clients dial `toxiproxy:(20000+i)`; the API is `toxiproxy:8474`.
    Both modes have exactly the same links (names, clients, servers).
    """
    sites = tuple(sites)
    procs = wan_processes(sites)
    names = Topology.link_names(sites)
    if mode == "native":
        ports = ports or {}
        proxy_ports = proxy_ports or {}
        binds = {p: f"{host}:{int(ports.get(p, 0))}" for p in procs}
        links = {}
        for n, c, s in names:
            listen = f"{host}:{int(proxy_ports.get(n, 0))}"
            links[n] = Link(n, c, s, listen=listen, upstream=binds[s], proxy_listen=listen)
        return Topology(sites=sites, host=host, binds=binds, links=links, toxiproxy_api="")
    if mode == "compose":
        binds = {p: f"0.0.0.0:{COMPOSE_BIND_PORT}" for p in procs}
        links = {}
        for i, (n, c, s) in enumerate(names):
            port = COMPOSE_PROXY_BASE_PORT + i
            links[n] = Link(n, c, s, listen=f"{COMPOSE_TOXIPROXY}:{port}",
                            upstream=f"{service_name(s)}:{COMPOSE_BIND_PORT}", proxy_listen=f"0.0.0.0:{port}")
        return Topology(sites=sites, host="0.0.0.0", binds=binds, links=links,
                        toxiproxy_api=f"{COMPOSE_TOXIPROXY}:{COMPOSE_TOXIPROXY_API_PORT}")
    raise ValueError(f"unknown topology mode {mode!r}; expected 'native' or 'compose'")


def link_map(topo: Topology) -> dict[str, tuple[str, str]]:
    """name -> (client, server): what must be the same whichever way the cluster runs."""
    return {n: (l.client, l.server) for n, l in topo.links.items()}
