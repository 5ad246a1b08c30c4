"""The one table of the cluster's processes: how each starts, whether it binds a port behind
Toxiproxy (and so has WAN links and byte counters), and the order it starts and stops in.

The launcher spawns and stops from it, `Topology` takes its processes and links from it, the
compose generator makes one service per process it can run in a container, and the byte ledger
asks it which logs must hold `wan_counters`. Adding a process is one entry here.

A process's name is the stem of its log (`RUN/logs/<name>.jsonl`). A per-site entry stands for one
process per site, named after the site; a site's intra-site workers log as `<site>.w<rank>`.
"""

from __future__ import annotations

from dataclasses import dataclass

COORD = "coord"
STORE = "store"
SITE = "{site}"  # the name of a per-site entry: one process per site, named after the site
TELEMETRY = "telemetry"
SITE_WORKER = "{site}.w{rank}"


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # log stem and process name; SITE for the per-site entry
    role: str  # what it is, in words
    module: str = ""  # `python -m <module> --run-dir RUN [...]` the launcher spawns ("" = the launcher does not)
    cli: str = ""  # the `xdc <cli> --run-dir RUN [...]` that runs it in the foreground: a compose service ("" = none)
    binds: bool = False  # binds a port behind Toxiproxy: it has WAN links (one proxy per directed link)
    byte_counters: bool = False  # logs cumulative `wan_counters` (every process with WAN links does)
    start_rank: int | None = None  # the launcher starts lower ranks first; None = not started by the launcher
    stop_rank: int | None = None  # ... and stops lower ranks first
    # A launcher hook (a module with start(launcher) / stop(launcher)) that starts and stops it instead
    # of a plain spawn and SIGTERM: the energy sampler waits for its idle baseline at both ends.
    hook: str = ""
    after: tuple[str, ...] = ()  # processes that must be up (healthy) before this one starts under compose

    @property
    def per_site(self) -> bool:
        return self.name == SITE

    def names(self, sites: tuple[str, ...] | list[str]) -> list[str]:
        """The process names this entry stands for in a cluster of `sites`."""
        return list(sites) if self.per_site else [self.name]

    def args(self, name: str) -> tuple[str, ...]:
        """The arguments after `--run-dir RUN` for process `name` of this entry."""
        return ("--site", name) if self.per_site else ()


# Table order is the order of `Topology.processes()` and of the service links (coord before store:
# the compose proxy ports are numbered in that order).
PROCESSES: tuple[ProcessSpec, ...] = (
    ProcessSpec(COORD, "coordinator", module="coordinator.service", cli="coordinator", binds=True,
                byte_counters=True, start_rank=2, stop_rank=2, after=(TELEMETRY,)),
    ProcessSpec(STORE, "checkpoint store", module="checkpoint_store.service", cli="store", binds=True,
                byte_counters=True, start_rank=1, stop_rank=3, after=(TELEMETRY,)),
    ProcessSpec(SITE, "site agent", module="site_agent.agent", cli="site", binds=True, byte_counters=True,
                start_rank=3, stop_rank=1, after=(COORD, STORE)),
    # First and last: its idle baselines are taken before any other process starts and after all stopped.
    # Under compose the services above wait for it (`after`), so `docker compose stop` stops it last.
    ProcessSpec(TELEMETRY, "energy sampler", module="telemetry.sampler", cli="sampler", start_rank=0, stop_rank=4,
                hook="telemetry.launch"),
    # Spawned by its site agent, not by the launcher; talks to its peers over torch.distributed, not the WAN.
    ProcessSpec(SITE_WORKER, "intra-site worker", module="site_agent.worker"),
    # Processes that only log.
    ProcessSpec("launcher", "native launcher"),
    ProcessSpec("prepare", "`xdc prepare` (compose init)"),
    ProcessSpec("summarize", "`xdc summarize`"),
    ProcessSpec("chaos", "chaos driver"),
)
BY_NAME = {p.name: p for p in PROCESSES}


def spec(name: str) -> ProcessSpec:
    return BY_NAME[name]


def process_spec_of_log(stem: str) -> ProcessSpec:
    """The entry a log `RUN/logs/<stem>.jsonl` belongs to: a named process, a site worker
    (`<site>.w<rank>`), else a site."""
    if stem in BY_NAME:
        return BY_NAME[stem]
    if ".w" in stem:
        return BY_NAME[SITE_WORKER]
    return BY_NAME[SITE]


def has_byte_counters(stem: str) -> bool:
    """Whether the process that writes log `stem` must log `wan_counters`."""
    return process_spec_of_log(stem).byte_counters


def wan_processes(sites: tuple[str, ...] | list[str]) -> list[str]:
    """Every process with WAN links (each binds one port behind Toxiproxy), in table order."""
    return [n for p in PROCESSES if p.binds for n in p.names(sites)]


def services() -> tuple[str, ...]:
    """The processes with WAN links that are not sites: every site has one link to each."""
    return tuple(p.name for p in PROCESSES if p.binds and not p.per_site)


def start_order() -> list[ProcessSpec]:
    """The entries the launcher starts, first first."""
    return sorted((p for p in PROCESSES if p.start_rank is not None), key=lambda p: p.start_rank or 0)


def stop_order() -> list[ProcessSpec]:
    """The entries the launcher stops, first first."""
    return sorted((p for p in PROCESSES if p.stop_rank is not None), key=lambda p: p.stop_rank or 0)


def compose_processes() -> list[ProcessSpec]:
    """The entries that are compose services (an `xdc` command runs each), in start order."""
    return [p for p in start_order() if p.cli]
