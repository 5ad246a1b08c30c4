"""The one registry of fault kinds: per kind its target, its parameters with their defaults, whether
it heals itself at once, what it takes down, which processes (and so which links) it hits, and how
the timeline draws it.

Pure description, nothing here acts: the scenario validator (chaos/scenario_check.py) accepts
exactly these kinds and fills in these defaults, each kind's nemesis (chaos/nemesis.py) registers
against its entry, the chaos driver asks `takes_down`, the oracle reads `site_kinds()`, and the
analysis (analysis/timeline.py, analysis/artifact.py) draws and attributes faults from here.
Adding a kind is one entry below plus its nemesis class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ground.processes import COORD, STORE, services

SERVICES = services()  # (COORD, STORE): a link always has a site at one end
TARGETS = ("site", "link", "store", "coord", "any")
DRAWN_AS = ("failure", "preemption")  # the timeline's marks a fault's injection is drawn as


@dataclass(frozen=True)
class Param:
    type: str  # "bool" | "number" | "int" | "choice" | "slicer"
    default: Any = None  # None = optional and absent unless given
    minimum: float | None = None
    exclusive_min: bool = False
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    doc: str = ""


@dataclass(frozen=True)
class FaultKind:
    target: str  # what it acts on: one of TARGETS
    params: Mapping[str, Param]
    doc: str
    instant: bool = False  # no duration: the fault heals itself as part of the injection
    needs_one_of: tuple[str, ...] = ()  # at least one of these params must be given
    # The target process is down (killed, not just stopped) until healed: the driver tells the
    # launcher so that its death does not end the run. (param, value): only when that param has it.
    takes_down: bool = False
    takes_down_if: tuple[str, Any] | None = None
    drawn_as: str = "failure"  # the timeline mark of its injection (one of DRAWN_AS)
    duration_at_least: str = ""  # a parameter (seconds) the fault's duration_s may not be below

    def defaults(self) -> dict[str, Any]:
        """The parameters a fault of this kind has when none is given."""
        return {k: p.default for k, p in self.params.items() if p.default is not None}


_RESTART = Param("bool", True, doc="restart the site when healed")
FAULT_KINDS: dict[str, FaultKind] = {
    "site_crash": FaultKind("site", {"restart": _RESTART}, "SIGKILL the site; heal = start it again (rejoin)",
                            takes_down=True),
    "site_preempt": FaultKind("site", {
        "grace_s": Param("number", 5.0, minimum=0, doc="notice before SIGKILL"),
        "restart": _RESTART},
        "SIGTERM (the preemption notice; the site announces it), SIGKILL after grace_s if still alive; "
        "heal = start it again", takes_down=True, drawn_as="preemption", duration_at_least="grace_s"),
    "site_hang": FaultKind("site", {}, "SIGSTOP the site; heal = SIGCONT"),
    "site_restart": FaultKind("site", {}, "SIGKILL the site and start it again at once (rejoin)", instant=True),
    "link_reset": FaultKind("link", {}, "disable the link's proxies (connections close, reconnects refused); "
                                        "heal = enable them"),
    "link_blackhole": FaultKind("link", {}, "timeout toxic of 0 on the link's streams (TCP stays up, nothing "
                                            "passes; only heartbeats notice); heal = remove it"),
    "link_degrade": FaultKind("link", {
        "latency_ms": Param("int", minimum=0, doc="added one-way latency"),
        "jitter_ms": Param("int", minimum=0, doc="+- jitter on the added latency"),
        "bandwidth_kbps": Param("int", minimum=0, exclusive_min=True, doc="KB/s (1000 B) cap; > 0"),
        # Toxiproxy's `timeout` and `reset_peer` toxics PASS NO DATA while they wait: they are cuts,
        # useful with toxicity < 1 (only some connections). reset_peer sleeps its timeout without
        # watching for removal once data arrived, so removing it blocks Toxiproxy's API up to that
        # long: hence the cap, below the control client's 5 s HTTP timeout.
        "timeout_ms": Param("int", minimum=0, exclusive_min=True,
                            doc="drop all data, close the connection after this long (0 is link_blackhole)"),
        "reset_peer_ms": Param("int", minimum=0, maximum=2000,
                               doc="at the first data, wait this long (dropping data) then TCP RST"),
        "slicer": Param("slicer", doc="{average_size, size_variation, delay_us}: split data into small chunks"),
        "toxicity": Param("number", 1.0, minimum=0, exclusive_min=True, maximum=1,
                          doc="fraction of connections affected"),
    }, "add shaping toxics to the link's streams; heal = remove them",
        needs_one_of=("latency_ms", "jitter_ms", "bandwidth_kbps", "timeout_ms", "reset_peer_ms", "slicer")),
    "store_outage": FaultKind("store", {"mode": Param("choice", "stop", choices=("stop", "kill"),
                                                      doc="stop = SIGSTOP (heal SIGCONT); kill = SIGKILL (heal restart)")},
                              "make the checkpoint store unavailable", takes_down_if=("mode", "kill")),
    "coord_crash": FaultKind("coord", {"restart": Param("bool", True, doc="restart the coordinator when healed")},
                             "SIGKILL the coordinator; heal = start it again", takes_down=True),
    "noop": FaultKind("any", {}, "does nothing (a marker, or a part switched off)"),
}
# {key: (minimum, exclusive)} of the slicer parameter's mapping
SLICER_KEYS = {"average_size": (1, True), "size_variation": (0, False), "delay_us": (0, False)}
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def takes_down(kind: str, params: Mapping[str, Any]) -> bool:
    """Whether a fault of `kind` with `params` leaves its target process down until it heals."""
    k = FAULT_KINDS[kind]
    if k.takes_down_if is not None:
        name, value = k.takes_down_if
        return params.get(name, k.params[name].default) == value
    return k.takes_down


def site_kinds() -> tuple[str, ...]:
    """The kinds that act on one site (the oracle sees those coming; the timeline draws them on its row)."""
    return tuple(n for n, k in FAULT_KINDS.items() if k.target == "site")


def drawn_as(kind: str) -> str:
    """The timeline mark of a fault's injection (a kind no longer registered is drawn as a failure)."""
    k = FAULT_KINDS.get(kind)
    return k.drawn_as if k is not None else "failure"


# ------------------------------------------------------------------------------ links


@dataclass(frozen=True)
class LinkTarget:
    """A parsed link spec: `a<->b` (both=True), `a->b` (src=a, dst=b), or `b` (dst None: all of b's links)."""

    src: str
    dst: str | None = None
    both: bool = False

    def directions(self) -> list[tuple[str, str]] | None:
        """The (from, to) pairs it covers; None for "all links of src"."""
        if self.dst is None:
            return None
        return [(self.src, self.dst), (self.dst, self.src)] if self.both else [(self.src, self.dst)]

    @property
    def ends(self) -> list[str]:
        return [self.src] if self.dst is None else [self.src, self.dst]


def parse_link_target(spec: str, sites: Iterable[str] | None = None) -> LinkTarget:
    """Parse "a<->b", "a->b", "a<-b" (= "b->a") or "b"; raises ValueError with the reason."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("expected a link spec like 'a<->b', 'a->b' or 'b'")
    s = spec.replace(" ", "")
    if "<->" in s:
        x, _, y = s.partition("<->")
        t = LinkTarget(x, y, both=True)
    elif "->" in s:
        x, _, y = s.partition("->")
        t = LinkTarget(x, y)
    elif "<-" in s:
        y, _, x = s.partition("<-")
        t = LinkTarget(x, y)
    else:
        t = LinkTarget(s)
    for n in t.ends:
        if not NAME_RE.fullmatch(n):
            raise ValueError(f"bad link spec {spec!r}: {n!r} is not a process name; "
                             "use 'a<->b' (both directions), 'a->b' (one direction) or 'b' (all of b's links)")
    if t.dst is not None:
        if t.src == t.dst:
            raise ValueError(f"bad link spec {spec!r}: a link joins two different processes")
        if t.src in SERVICES and t.dst in SERVICES:
            raise ValueError(f"bad link spec {spec!r}: there is no link between {t.src} and {t.dst}; "
                             "every link has a site at one end")
    if sites is not None:
        known = [*sites, *SERVICES]
        for n in t.ends:
            if n not in known:
                raise ValueError(f"unknown process {n!r} in link spec {spec!r}; known: {known}")
    return t


_OLD_NAMES = {"coordinator": COORD, "checkpoint_store": STORE}  # process names in older logs


def processes_hit(kind: str, target: str) -> set[str]:
    """The processes a fault touches: its target process, or both ends of the links it cuts or
    shapes (every link of `b` for the spec "b"); the links it affects are theirs."""
    if not target:
        return set()
    if FAULT_KINDS.get(kind, FaultKind("any", {}, "")).target == "link":
        try:
            return set(parse_link_target(target).ends)
        except ValueError:
            return set()
    return {_OLD_NAMES.get(target, target)}


def links_hit(kind: str, target: str, links: Iterable[str]) -> set[str]:
    """Which of `links` (named `<client>_to_<server>`) have an end in a process the fault touches."""
    hit = processes_hit(kind, target)
    return {lk for lk in links if any(lk.startswith(f"{x}_to_") or lk.endswith(f"_to_{x}") for x in hit)}
