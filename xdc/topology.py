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

from wan.node import Route

COORD = "coord"
STORE = "store"
SERVICES = (COORD, STORE)


@dataclass(frozen=True)
class Link:
    name: str
    client: str
    server: str
    listen: str = ""  # host:port of the Toxiproxy listener (filled in when the proxy exists)
    upstream: str = ""  # host:port the server binds


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
        return [COORD, STORE, *self.sites]

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
