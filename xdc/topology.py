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
    return {COORD: "coordinator", STORE: "store"}.get(process, f"site-{process}")


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
    procs = (COORD, STORE, *sites)
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


# ------------------------------------------------------------------------------ compose
# compose/docker-compose.yml (and the GPU override) are generated from the compose plan by
# `xdc compose generate`; tests check the committed files equal what this produces.

COMPOSE_PROJECT = "xdc"
TOXIPROXY_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"  # the official image, pinned like the Makefile's binary
# The xdc image's bases; on a machine without a registry `make compose-setup` builds local stand-ins
# and names them in compose/.env (XDC_BASE_IMAGE, XDC_DOCKER_CLI_IMAGE, XDC_TOXIPROXY_IMAGE).
BASE_IMAGE = "python:3.11.11-slim-bookworm"
DOCKER_CLI_IMAGE = "docker:27.5.1-cli"
# The one network that is not internal: it only carries Toxiproxy's API to the host's loopback.
API_NETWORK = "net-toxiproxy-api"
RUN_DIR_IN_CONTAINER = "/runs/${XDC_RUN_ID:-compose-run}"
COMPOSE_HEADER = ("# GENERATED by `xdc compose generate` from xdc/topology.py (plan_topology(..., 'compose')).\n"
                  "# Do not edit by hand: change the topology and regenerate (`make compose-generate`).\n")


def network_name(process: str) -> str:
    """Each process has its own network shared only with Toxiproxy: it can reach nothing else.

    These networks are `internal`: no route leaves them (no gateway to the host's network), so a
    process reaches Toxiproxy, and through it its peers, and no other address at all.
    """
    return f"net-{service_name(process)}"


def compose_spec(sites: tuple[str, ...] | list[str] = ("a", "b", "c")) -> dict:
    """The docker-compose document of a cluster of these sites (a plain dict, YAML-ready)."""
    topo = plan_topology(tuple(sites), "compose")
    procs = topo.processes()
    image = "${XDC_IMAGE:-xdc:local}"
    env = {"XDC_RUN_ID": "${XDC_RUN_ID:-compose-run}", "PYTHONUNBUFFERED": "1"}

    def xdc_service(command: list[str], networks: list[str], **extra: object) -> dict:
        # Only `init` builds the image; the others use that same image and never pull it.
        return {"image": image, "pull_policy": "never",
                "user": "${XDC_UID:-10001}", "command": command, "environment": dict(env),
                "volumes": ["runs:/runs"], "networks": networks, "restart": "no", **extra}

    # The logs name a process incarnation by its pid (analysis counts a restarted process's bytes and
    # work per pid). In its own PID namespace every container's process is pid 1, on every restart,
    # so the processes share the host's: each incarnation has a pid of its own, as natively.
    pid_host = {"pid": "host"}

    def healthy_when_logging(process: str) -> dict:
        log = f"{RUN_DIR_IN_CONTAINER}/logs/{process}.jsonl"
        return {"test": ["CMD", "python", "-c", f"import os,sys; sys.exit(os.path.getsize('{log}') == 0)"],
                "interval": "2s", "timeout": "5s", "retries": 60, "start_period": "5s"}

    ports = sorted(int(l.proxy_listen.rsplit(":", 1)[1]) for l in topo.links.values())
    services: dict[str, dict] = {
        COMPOSE_TOXIPROXY: {
            "image": f"${{XDC_TOXIPROXY_IMAGE:-{TOXIPROXY_IMAGE}}}",
            "command": ["-host=0.0.0.0", f"-port={COMPOSE_TOXIPROXY_API_PORT}", "-proxy-metrics"],
            # The API is published on loopback only, for chaos and analysis from the host; the
            # proxy ports (20000..) are not published: only the project's containers dial them.
            "ports": [f"127.0.0.1:${{XDC_TOXIPROXY_API_PORT:-{COMPOSE_TOXIPROXY_API_PORT}}}:"
                      f"{COMPOSE_TOXIPROXY_API_PORT}"],
            "expose": [str(p) for p in ports],
            "healthcheck": {"test": ["CMD", "/toxiproxy-cli", "list"], "interval": "2s", "timeout": "5s",
                            "retries": 30},
            # The API network last: the per-process networks are internal, so the published port
            # goes through the one network with a gateway, which no other service joins.
            "networks": [*(network_name(p) for p in procs), API_NETWORK],
            "restart": "no",
        },
        "init": xdc_service(["xdc", "prepare", "--run-dir", RUN_DIR_IN_CONTAINER, "--topology", "compose",
                             "--toxiproxy", f"{COMPOSE_TOXIPROXY}:{COMPOSE_TOXIPROXY_API_PORT}",
                             "--config", "${XDC_CONFIG:-compose/run.yaml}", "--sites", ",".join(topo.sites)],
                            [network_name(COORD)],
                            depends_on={COMPOSE_TOXIPROXY: {"condition": "service_healthy"}}),
    }
    services["init"].pop("pull_policy")
    services["init"]["build"] = {"context": "..", "dockerfile": "compose/Dockerfile",
                                 "args": {"XDC_UID": "${XDC_UID:-10001}",
                                          "XDC_BASE_IMAGE": f"${{XDC_BASE_IMAGE:-{BASE_IMAGE}}}",
                                          "XDC_DOCKER_CLI_IMAGE": f"${{XDC_DOCKER_CLI_IMAGE:-{DOCKER_CLI_IMAGE}}}"}}
    ready = {"init": {"condition": "service_completed_successfully"},
             COMPOSE_TOXIPROXY: {"condition": "service_healthy"}}
    services[service_name(STORE)] = xdc_service(["xdc", "store", "--run-dir", RUN_DIR_IN_CONTAINER],
                                                [network_name(STORE)], depends_on=dict(ready),
                                                healthcheck=healthy_when_logging(STORE), **pid_host)
    services[service_name(COORD)] = xdc_service(["xdc", "coordinator", "--run-dir", RUN_DIR_IN_CONTAINER],
                                                [network_name(COORD)], depends_on=dict(ready),
                                                healthcheck=healthy_when_logging(COORD), **pid_host)
    for s in topo.sites:
        services[service_name(s)] = xdc_service(
            ["xdc", "site", "--run-dir", RUN_DIR_IN_CONTAINER, "--site", s], [network_name(s)],
            depends_on={**ready, service_name(COORD): {"condition": "service_healthy"},
                        service_name(STORE): {"condition": "service_healthy"}},
            healthcheck=healthy_when_logging(s), **pid_host)
    # Chaos as its own profile: `docker compose --profile chaos up chaos` (the docker CLI in the
    # image drives the project's containers through the mounted Docker socket).
    chaos = xdc_service(["xdc", "chaos", "${XDC_SCENARIO:-scenarios/compose-smoke.yaml}", "--run", RUN_DIR_IN_CONTAINER,
                         "--docker", "--project", COMPOSE_PROJECT], [network_name(COORD)],
                        depends_on={"init": {"condition": "service_completed_successfully"}},
                        profiles=["chaos"])
    chaos["volumes"] = ["runs:/runs", "/var/run/docker.sock:/var/run/docker.sock"]
    chaos["group_add"] = ["${DOCKER_GID:-0}"]
    services["chaos"] = chaos
    # After the run: the summary (with Toxiproxy's byte counters) into RUN/summary.json.
    services["summarize"] = xdc_service(["xdc", "summarize", "--run-dir", RUN_DIR_IN_CONTAINER, "--toxiproxy",
                                         f"{COMPOSE_TOXIPROXY}:{COMPOSE_TOXIPROXY_API_PORT}"],
                                        [network_name(COORD)], profiles=["analyze"])
    # Then the artifact and the report, from the logs in the shared runs volume (as for a native run).
    services["analyze"] = xdc_service(["xdc", "analyze", RUN_DIR_IN_CONTAINER], [network_name(COORD)],
                                      depends_on={"summarize": {"condition": "service_completed_successfully"}},
                                      profiles=["analyze"])
    return {
        "name": COMPOSE_PROJECT,
        "services": services,
        "networks": {**{network_name(p): {"internal": True} for p in procs}, API_NETWORK: {}},
        "volumes": {"runs": {"name": "${XDC_RUNS_VOLUME:-xdc-runs}"}},
    }


def compose_gpu_spec(sites: tuple[str, ...] | list[str] = ("a", "b", "c")) -> dict:
    """The override that shares the host's GPU(s) with every site (`-f docker-compose.gpu.yml`)."""
    gpu = {"resources": {"reservations": {"devices": [{"driver": "nvidia", "count": "all",
                                                       "capabilities": ["gpu"]}]}}}
    return {"services": {service_name(s): {"deploy": gpu} for s in sites}}
