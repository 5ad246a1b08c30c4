"""Chaos scenarios: a schedule of faults, from a YAML/TOML file or from a Python script.

A scenario is a name, a description, a seed and a tuple of faults. A fault is a kind (one
nemesis each, see `chaos/nemesis.py`), a target, a trigger that says when it is injected, an
optional healing point (`duration_s` after the injection, or a `heal` trigger; neither = it stays
until the end of the run) and the parameters of its kind.

File form (YAML; TOML is the same tree with `[[faults]]` tables):

    name: one-outage
    description: Site b crashes a third of the way in and is restarted 10 s later.
    seed: 0
    faults:
      - kind: site_crash
        target: b
        at_useful_tokens: 92000     # exactly one of at_s | at_step | at_useful_tokens
        duration_s: 10              # or  heal: {at_step: 40};  neither = until the end
        params: {restart: true}     # per kind, see KINDS

Triggers: `at_s` counts seconds from the moment the cluster formed its first membership epoch
(the scenario clock starts there); `at_step` and `at_useful_tokens` follow the coordinator's
`commit` events, so a progress trigger hits the same point of training whatever the policy or
the speed of the machine.

Targets: a process kind (site_crash, site_preempt, site_hang, site_restart) takes a site name;
store_outage and coord_crash take "store" / "coord" (the default); a link kind takes a link
spec: "a<->b" (both directions between a and b), "a->b" (only what a sends towards b, see
`chaos/handle.py` for the proxies and streams that carries), or "b" (every link of b, to the
other sites and to the services: b is cut off).

Every validation error is a `ScenarioError` naming the file, the line and the dotted field:
`scenarios/x.yaml:12: faults[1].kind: unknown fault kind 'crsh'; known: [...]`.

The Python API builds the same frozen objects through the same validation:

    sc = (Scenario.build("mine", "b dies, a and c lose each other for 5 s")
          .crash("b", at_s=10, restart_after_s=15)
          .blackhole("a<->c", at_step=20, duration_s=5))
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

COORD, STORE = "coord", "store"
SERVICES = (COORD, STORE)
TRIGGER_KEYS = ("at_s", "at_step", "at_useful_tokens")


class ScenarioError(ValueError):
    """A scenario is invalid. `file`, `line` (1-based, None when unknown), `field` (dotted path)
    and `reason` are kept separately; str() is `file:line: field: reason`."""

    def __init__(self, file: str, line: int | None, field_path: str, reason: str) -> None:
        self.file = file
        self.line = line
        self.field = field_path
        self.reason = reason
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {field_path}: {reason}" if field_path else f"{where}: {reason}")


# ------------------------------------------------------------------------------ value objects


@dataclass(frozen=True)
class Trigger:
    """When something happens: exactly one of
    `at_s` (seconds since the cluster formed its first membership epoch),
    `at_step` (the first commit with step >= this), `at_useful_tokens` (first commit with
    useful_tokens >= this)."""

    at_s: float | None = None
    at_step: int | None = None
    at_useful_tokens: int | None = None

    def __post_init__(self) -> None:
        given = [k for k in TRIGGER_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a trigger needs exactly one of {list(TRIGGER_KEYS)}; got {given or 'none'}")

    @property
    def key(self) -> str:
        return next(k for k in TRIGGER_KEYS if getattr(self, k) is not None)

    @property
    def value(self) -> float | int:
        return getattr(self, self.key)

    @property
    def by_progress(self) -> bool:
        return self.key != "at_s"

    def to_dict(self) -> dict[str, Any]:
        return {self.key: self.value}

    def __str__(self) -> str:
        return f"{self.key}={self.value:g}" if self.key == "at_s" else f"{self.key}={self.value}"


@dataclass(frozen=True)
class Fault:
    """One fault of a scenario. `params` holds every parameter of its kind, defaults filled in."""

    kind: str
    target: str
    trigger: Trigger
    duration_s: float | None = None  # heal this long after the injection
    heal: Trigger | None = None  # or heal at this point; neither = until the end of the run
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    note: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.params, MappingProxyType):  # read-only, like the rest of the fault
            object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    @property
    def permanent(self) -> bool:
        return self.duration_s is None and self.heal is None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "target": self.target, **self.trigger.to_dict()}
        if self.duration_s is not None:
            d["duration_s"] = self.duration_s
        if self.heal is not None:
            d["heal"] = self.heal.to_dict()
        d["params"] = _plain(self.params)
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    faults: tuple[Fault, ...] = ()
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "seed": self.seed,
                "faults": [f.to_dict() for f in self.faults]}

    @staticmethod
    def from_dict(data: Mapping[str, Any], *, source: str = "<dict>",
                  sites: Iterable[str] | None = None) -> "Scenario":
        return _Validator(source, {}, sites).scenario(data)

    # ---- the Python API: every method returns a new Scenario with one more fault ----------

    @staticmethod
    def build(name: str, description: str = "", *, seed: int = 0) -> "Scenario":
        """An empty scenario to chain faults onto (`.crash(...).blackhole(...)`)."""
        return _Validator("<script>", {}, None).scenario({"name": name, "description": description, "seed": seed})

    def add(self, kind: str, target: str | None = None, *, at_s: float | None = None, at_step: int | None = None,
            at_useful_tokens: int | None = None, duration_s: float | None = None,
            heal: Trigger | Mapping[str, Any] | None = None, note: str = "",
            sites: Iterable[str] | None = None, **params: Any) -> "Scenario":
        """Append one fault of any kind, validated exactly as a file's fault is."""
        raw: dict[str, Any] = {"kind": kind}
        if target is not None:
            raw["target"] = target
        for k, v in (("at_s", at_s), ("at_step", at_step), ("at_useful_tokens", at_useful_tokens),
                     ("duration_s", duration_s)):
            if v is not None:
                raw[k] = v
        if heal is not None:
            raw["heal"] = heal.to_dict() if isinstance(heal, Trigger) else dict(heal)
        if params:
            raw["params"] = params
        if note:
            raw["note"] = note
        fault = _Validator("<script>", {}, sites).fault(raw, ("faults", len(self.faults)))
        return dataclasses.replace(self, faults=(*self.faults, fault))

    def crash(self, site: str, *, restart_after_s: float | None = None, **kw: Any) -> "Scenario":
        """SIGKILL a site; restarted `restart_after_s` later (None: it stays down)."""
        return self.add("site_crash", site, duration_s=restart_after_s, **kw)

    def preempt(self, site: str, *, grace_s: float = 5.0, return_after_s: float | None = None,
                **kw: Any) -> "Scenario":
        """SIGTERM a site (its preemption notice), SIGKILL it if still alive after `grace_s`;
        restarted `return_after_s` after the notice (None: it stays away)."""
        return self.add("site_preempt", site, duration_s=return_after_s, grace_s=grace_s, **kw)

    def hang(self, site: str, **kw: Any) -> "Scenario":
        """SIGSTOP a site; SIGCONT when healed."""
        return self.add("site_hang", site, **kw)

    def restart(self, site: str, **kw: Any) -> "Scenario":
        """SIGKILL a site and start it again at once (it must rejoin)."""
        return self.add("site_restart", site, **kw)

    def reset(self, link: str, **kw: Any) -> "Scenario":
        """Disable the link's Toxiproxy proxies (open connections close, new ones are refused)."""
        return self.add("link_reset", link, **kw)

    def blackhole(self, link: str, **kw: Any) -> "Scenario":
        """A `timeout` toxic of 0: TCP stays up and nothing passes."""
        return self.add("link_blackhole", link, **kw)

    def degrade(self, link: str, **kw: Any) -> "Scenario":
        """Latency/jitter/bandwidth/timeout/reset_peer/slicer toxics (see KINDS['link_degrade'])."""
        return self.add("link_degrade", link, **kw)

    def store_outage(self, *, mode: str = "stop", **kw: Any) -> "Scenario":
        """Stop (SIGSTOP) or kill (SIGKILL) the checkpoint store."""
        return self.add("store_outage", STORE, mode=mode, **kw)

    def coord_crash(self, *, restart_after_s: float | None = None, **kw: Any) -> "Scenario":
        """SIGKILL the coordinator; restarted `restart_after_s` later."""
        return self.add("coord_crash", COORD, duration_s=restart_after_s, **kw)

    def noop(self, target: str = "", **kw: Any) -> "Scenario":
        """A fault that does nothing (a marker, or a stand-in for a part switched off)."""
        return self.add("noop", target, **kw)


# ------------------------------------------------------------------------------ reachability


@dataclass(frozen=True)
class UnreachableTrigger:
    """A fault whose progress trigger lies beyond the end of the run: it can never fire."""

    index: int
    fault: Fault
    key: str  # "at_step" | "at_useful_tokens"
    value: int
    end: int  # where a fault-free run ends, in the same unit

    def __str__(self) -> str:
        unit = "useful tokens" if self.key == "at_useful_tokens" else "step"
        where = f"{self.end:,} {unit}" if unit != "step" else f"step {self.end:,}"
        return (f"faults[{self.index}] ({self.fault.kind} {self.fault.target or '-'}) triggers at "
                f"{self.key}={self.value:,}, but the run ends at {where}: it would never fire")


def unreachable_triggers(scenario: Scenario, *, end_useful_tokens: int, end_step: int) -> list[UnreachableTrigger]:
    """Faults whose injection trigger is a progress point past the run's end (a fault-free run
    ends at `end_useful_tokens` / `end_step`; the last commit is the last point a trigger sees).
    Wall-time triggers (`at_s`) cannot be judged before the run: they are reported if unfired."""
    out = []
    for i, f in enumerate(scenario.faults):
        t = f.trigger
        if t.at_useful_tokens is not None and t.at_useful_tokens > end_useful_tokens:
            out.append(UnreachableTrigger(i, f, "at_useful_tokens", t.at_useful_tokens, end_useful_tokens))
        elif t.at_step is not None and t.at_step > end_step:
            out.append(UnreachableTrigger(i, f, "at_step", t.at_step, end_step))
    return out


# ------------------------------------------------------------------------------ kinds


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
class KindSpec:
    target: str  # "site" | "link" | "store" | "coord" | "any"
    params: Mapping[str, Param]
    doc: str
    instant: bool = False  # no duration: the fault heals itself as part of the injection
    needs_one_of: tuple[str, ...] = ()  # at least one of these params must be given


_INT0 = Param("int", minimum=0)
KINDS: dict[str, KindSpec] = {
    "site_crash": KindSpec("site", {"restart": Param("bool", True, doc="restart the site when healed")},
                           "SIGKILL the site; heal = start it again (rejoin)"),
    "site_preempt": KindSpec("site", {
        "grace_s": Param("number", 5.0, minimum=0, doc="notice before SIGKILL"),
        "restart": Param("bool", True, doc="restart the site when healed")},
        "SIGTERM (the preemption notice; the site announces it), SIGKILL after grace_s if still alive; "
        "heal = start it again"),
    "site_hang": KindSpec("site", {}, "SIGSTOP the site; heal = SIGCONT"),
    "site_restart": KindSpec("site", {}, "SIGKILL the site and start it again at once (rejoin)", instant=True),
    "link_reset": KindSpec("link", {}, "disable the link's proxies (connections close, reconnects refused); "
                                       "heal = enable them"),
    "link_blackhole": KindSpec("link", {}, "timeout toxic of 0 on the link's streams (TCP stays up, nothing "
                                           "passes; only heartbeats notice); heal = remove it"),
    "link_degrade": KindSpec("link", {
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
    "store_outage": KindSpec("store", {"mode": Param("choice", "stop", choices=("stop", "kill"),
                                                     doc="stop = SIGSTOP (heal SIGCONT); kill = SIGKILL (heal restart)")},
                             "make the checkpoint store unavailable"),
    "coord_crash": KindSpec("coord", {"restart": Param("bool", True, doc="restart the coordinator when healed")},
                            "SIGKILL the coordinator; heal = start it again"),
    "noop": KindSpec("any", {}, "does nothing (a marker, or a part switched off)"),
}
SLICER_KEYS = {"average_size": (1, True), "size_variation": (0, False), "delay_us": (0, False)}
FAULT_KEYS = ("kind", "target", *TRIGGER_KEYS, "duration_s", "heal", "params", "note")
TOP_KEYS = ("name", "description", "seed", "faults")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")


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
    names = [t.src] if t.dst is None else [t.src, t.dst]
    for n in names:
        if not _NAME_RE.match(n):
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
        for n in names:
            if n not in known:
                raise ValueError(f"unknown process {n!r} in link spec {spec!r}; known: {known}")
    return t


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


# ------------------------------------------------------------------------------ validation

FieldPath = tuple[Any, ...]


def _dotted(path: FieldPath) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


class _Validator:
    def __init__(self, source: str, lines: Mapping[FieldPath, int], sites: Iterable[str] | None) -> None:
        self.source = source
        self.lines = lines
        self.sites = tuple(sites) if sites is not None else None

    def line(self, path: FieldPath) -> int | None:
        p = tuple(path)
        while True:
            if p in self.lines:
                return self.lines[p]
            if not p:
                return None
            p = p[:-1]

    def err(self, path: FieldPath, reason: str) -> ScenarioError:
        return ScenarioError(self.source, self.line(path), _dotted(path), reason)

    def mapping(self, v: Any, path: FieldPath, what: str) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            raise self.err(path, f"expected {what} (a mapping), got {_tname(v)}")
        return v

    def unknown(self, d: Mapping[str, Any], known: Iterable[str], path: FieldPath) -> None:
        known = list(known)
        for k in d:
            if k not in known:
                hint = difflib.get_close_matches(str(k), known, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise self.err((*path, k), f"unknown field{extra}; known: {known}")

    def number(self, v: Any, path: FieldPath, *, minimum: float | None = 0, exclusive: bool = False,
               integer: bool = False, what: str = "a number") -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
            raise self.err(path, f"expected {what}, got {_tname(v)} {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise self.err(path, f"expected a finite number, got {v!r}")
        if minimum is not None and (v < minimum or (exclusive and v == minimum)):
            raise self.err(path, f"must be {'>' if exclusive else '>='} {minimum:g}, got {v!r}")
        return v

    # ---- pieces ------------------------------------------------------------------------

    def scenario(self, data: Any) -> Scenario:
        d = self.mapping(data, (), "a scenario")
        self.unknown(d, TOP_KEYS, ())
        name = d.get("name", None if self.source.startswith("<") else Path(self.source).stem)
        if name is None:
            raise self.err(("name",), "missing: a scenario needs a name")
        if not isinstance(name, str) or not name.strip():
            raise self.err(("name",), f"expected a non-empty string, got {_tname(name)} {name!r}")
        desc = d.get("description", "")
        if not isinstance(desc, str):
            raise self.err(("description",), f"expected a string, got {_tname(desc)}")
        seed = self.number(d.get("seed", 0), ("seed",), integer=True, what="an integer")
        faults_raw = d.get("faults", [])
        if faults_raw is None:
            faults_raw = []
        if not isinstance(faults_raw, (list, tuple)):
            raise self.err(("faults",), f"expected a list of faults, got {_tname(faults_raw)}")
        faults = tuple(self.fault(f, ("faults", i)) for i, f in enumerate(faults_raw))
        return Scenario(name=name.strip(), description=" ".join(desc.split()), faults=faults, seed=seed)

    def trigger(self, d: Mapping[str, Any], path: FieldPath, *, required: bool) -> Trigger | None:
        given = [k for k in TRIGGER_KEYS if k in d and d[k] is not None]
        if len(given) > 1:
            raise self.err((*path, given[1]), f"give exactly one trigger of {list(TRIGGER_KEYS)}; "
                                              f"got {' and '.join(given)}")
        if not given:
            if required:
                raise self.err(path, f"missing trigger: give one of {list(TRIGGER_KEYS)}")
            return None
        k = given[0]
        if k == "at_s":
            v = self.number(d[k], (*path, k), what="a number of seconds")
            return Trigger(at_s=float(v))
        v = self.number(d[k], (*path, k), integer=True, what="an integer")
        return Trigger(**{k: v})

    def target(self, kind: str, spec: KindSpec, raw: Any, path: FieldPath) -> str:
        if raw is None:
            if spec.target == "store":
                return STORE
            if spec.target == "coord":
                return COORD
            if spec.target == "any":
                return ""
            what = "a site name like 'b'" if spec.target == "site" else "a link spec like 'a<->b', 'a->b' or 'b'"
            raise self.err((*path, "target"), f"missing: {kind} needs a target ({what})")
        tpath = (*path, "target")
        if not isinstance(raw, str):
            raise self.err(tpath, f"expected a string, got {_tname(raw)} {raw!r}")
        t = raw.strip()
        if spec.target in ("store", "coord"):
            if t != spec.target:
                raise self.err(tpath, f"{kind} acts on {spec.target!r}, not {t!r}")
            return t
        if spec.target == "site":
            if t in SERVICES:
                raise self.err(tpath, f"{kind} acts on a site, not the {t!r} service "
                                      f"(use {'store_outage' if t == STORE else 'coord_crash'})")
            if not _NAME_RE.match(t):
                raise self.err(tpath, f"{t!r} is not a site name (a link spec? {kind} acts on one process)")
            if self.sites is not None and t not in self.sites:
                raise self.err(tpath, f"unknown site {t!r}; known sites: {list(self.sites)}")
            return t
        if spec.target == "link":
            try:
                parse_link_target(t, self.sites)
            except ValueError as e:
                raise self.err(tpath, str(e)) from None
            return t
        return t  # "any"

    def params(self, kind: str, spec: KindSpec, raw: Any, path: FieldPath) -> dict[str, Any]:
        ppath = (*path, "params")
        d = {} if raw is None else self.mapping(raw, ppath, f"the parameters of {kind}")
        if d and not spec.params:
            k = next(iter(d))
            raise self.err((*ppath, k), f"{kind} takes no parameters")
        self.unknown(d, spec.params, ppath)
        out: dict[str, Any] = {}
        for name, p in spec.params.items():
            fp = (*ppath, name)
            if name not in d or d[name] is None:
                if p.default is not None:
                    out[name] = p.default
                continue
            v = d[name]
            if p.type == "bool":
                if not isinstance(v, bool):
                    raise self.err(fp, f"expected true/false, got {_tname(v)} {v!r}")
            elif p.type in ("number", "int"):
                v = self.number(v, fp, minimum=p.minimum, exclusive=p.exclusive_min, integer=p.type == "int",
                                what="an integer" if p.type == "int" else "a number")
                if p.maximum is not None and v > p.maximum:
                    raise self.err(fp, f"must be <= {p.maximum:g}, got {v!r}")
                if p.type == "number":
                    v = float(v)
            elif p.type == "choice":
                if v not in p.choices:
                    raise self.err(fp, f"{v!r} is not one of {list(p.choices)}")
            elif p.type == "slicer":
                sd = self.mapping(v, fp, "the slicer settings {average_size, size_variation, delay_us}")
                self.unknown(sd, SLICER_KEYS, fp)
                if "average_size" not in sd:
                    raise self.err(fp, "missing: slicer needs average_size (bytes)")
                v = {k: self.number(sd.get(k, 0), (*fp, k), minimum=lo, exclusive=ex, integer=True,
                                    what="an integer") for k, (lo, ex) in SLICER_KEYS.items()}
                if v["size_variation"] >= v["average_size"]:
                    raise self.err((*fp, "size_variation"), "must be smaller than average_size")
            out[name] = v
        if spec.needs_one_of and not any(k in out for k in spec.needs_one_of):
            raise self.err(ppath if raw is not None else path,
                           f"missing: {kind} needs at least one of {list(spec.needs_one_of)}")
        return out

    def fault(self, raw: Any, path: FieldPath) -> Fault:
        d = self.mapping(raw, path, "a fault")
        if "kind" not in d:
            raise self.err((*path, "kind"), f"missing: every fault needs a kind; known: {sorted(KINDS)}")
        kind = d["kind"]
        if not isinstance(kind, str) or kind not in KINDS:
            hint = difflib.get_close_matches(str(kind), list(KINDS), n=1)
            raise self.err((*path, "kind"), f"unknown fault kind {kind!r}"
                                            f"{f' (did you mean {hint[0]!r}?)' if hint else ''}; known: {sorted(KINDS)}")
        spec = KINDS[kind]
        self.unknown(d, FAULT_KEYS, path)
        trig = self.trigger(d, path, required=True)
        assert trig is not None
        target = self.target(kind, spec, d.get("target"), path)
        duration = d.get("duration_s")
        heal_raw = d.get("heal")
        if duration is not None and heal_raw is not None:
            raise self.err((*path, "heal"), "give duration_s or heal, not both")
        if spec.instant and (duration is not None or heal_raw is not None):
            k = "duration_s" if duration is not None else "heal"
            raise self.err((*path, k), f"{kind} heals itself at once (kill + immediate restart); drop {k}")
        if duration is not None:
            duration = float(self.number(duration, (*path, "duration_s"), exclusive=True,
                                         what="a number of seconds"))
        heal = None
        if heal_raw is not None:
            hd = self.mapping(heal_raw, (*path, "heal"), "a heal trigger like {at_step: 40}")
            self.unknown(hd, TRIGGER_KEYS, (*path, "heal"))
            heal = self.trigger(hd, (*path, "heal"), required=True)
            assert heal is not None
            if heal.key == trig.key and heal.value <= trig.value:
                raise self.err((*path, "heal", heal.key), f"heals at {heal} but is injected at {trig}: "
                                                          "the heal must come after the injection")
        params = self.params(kind, spec, d.get("params"), path)
        if kind == "site_preempt" and duration is not None and duration < params["grace_s"]:
            raise self.err((*path, "duration_s"), f"the site returns after {duration:g} s but its notice "
                                                  f"(grace_s) is {params['grace_s']:g} s; use duration_s >= grace_s")
        note = d.get("note", "")
        if not isinstance(note, str):
            raise self.err((*path, "note"), f"expected a string, got {_tname(note)}")
        return Fault(kind=kind, target=target, trigger=trig, duration_s=duration, heal=heal, params=params,
                     note=" ".join(note.split()))


def _tname(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "nothing"}.get(type(v), type(v).__name__)


# ------------------------------------------------------------------------------ files


def _yaml_tree(text: str, source: str) -> tuple[Any, dict[FieldPath, int]]:
    """Parse YAML into plain values plus the 1-based line of every path (from node marks)."""
    import yaml

    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        raise ScenarioError(source, line, "", f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(source, None, "", f"not valid YAML: {e}") from None
    lines: dict[FieldPath, int] = {}
    constructor = yaml.SafeLoader("")  # resolves plain scalars (ints, floats, bools, null)

    def walk(n: Any, path: FieldPath) -> Any:
        lines[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            constructor.flatten_mapping(n)  # merge keys (<<)
            out: dict[Any, Any] = {}
            for kn, vn in n.value:
                k = constructor.construct_object(kn, deep=True)
                if not isinstance(k, (str, int, float, bool)) or k is None:
                    raise ScenarioError(source, kn.start_mark.line + 1, _dotted(path), f"bad key {k!r}")
                if k in out:
                    raise ScenarioError(source, kn.start_mark.line + 1, _dotted((*path, k)), "duplicate key")
                out[k] = walk(vn, (*path, k))
                lines[(*path, k)] = kn.start_mark.line + 1  # the key's line (a block value starts below it)
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(c, (*path, i)) for i, c in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    if node is None:
        return {}, lines
    return walk(node, ()), lines


_TOML_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def _toml_lines(text: str) -> dict[FieldPath, int]:
    """Best-effort line of each path of a scenario TOML (tomllib keeps no positions):
    top-level keys, each `[[faults]]` table, its keys, and `[faults.params]`/`[faults.heal]`
    sub-tables or inline tables."""
    lines: dict[FieldPath, int] = {(): 1}
    table: FieldPath = ()
    n_faults = -1
    for no, line in enumerate(text.splitlines(), 1):
        m = _TOML_HEADER.match(line)
        if m and line.lstrip().startswith("["):
            name = m.group(1).strip()
            if line.lstrip().startswith("[[") and name == "faults":
                n_faults += 1
                table = ("faults", n_faults)
            elif name.startswith("faults.") and n_faults >= 0:
                table = ("faults", n_faults, *name.split(".")[1:])
            else:
                table = tuple(name.split("."))
            lines.setdefault(table, no)
            continue
        m = _TOML_KEY.match(line)
        if m:
            lines.setdefault((*table, m.group(1)), no)
            # keys of an inline table on the same line: params = {latency_ms = 80}
            if "{" in line:
                for k in re.findall(r"[{,]\s*([A-Za-z0-9_-]+)\s*=", line):
                    lines.setdefault((*table, m.group(1), k), no)
    return lines


def parse_scenario(text: str, source: str = "<string>", *, fmt: str = "yaml",
                   sites: Iterable[str] | None = None) -> Scenario:
    """Parse and validate scenario text (fmt "yaml" or "toml")."""
    if fmt == "toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"line (\d+)", str(e))
            raise ScenarioError(source, int(m.group(1)) if m else None, "", f"not valid TOML: {e}") from None
        lines = _toml_lines(text)
    elif fmt == "yaml":
        data, lines = _yaml_tree(text, source)
    else:
        raise ValueError(f"unknown scenario format {fmt!r}; use 'yaml' or 'toml'")
    if data is None:
        data = {}
    return _Validator(source, lines, sites).scenario(data)


def load_scenario(path: str | Path, sites: Iterable[str] | None = None) -> Scenario:
    """Load a scenario file: `.toml` is TOML, anything else YAML. With `sites`, targets are checked
    against them. A file without `name:` is named after its stem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(str(p), None, "", f"cannot read scenario file: {e.strerror or e}") from None
    return parse_scenario(text, str(p), fmt="toml" if p.suffix.lower() == ".toml" else "yaml", sites=sites)
