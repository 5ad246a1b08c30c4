"""Chaos scenarios' value objects: a Trigger (when), a Fault (what, where, how long) and a Scenario
(a named, seeded tuple of faults) with its Python builder. Frozen; built only through the
validator (chaos/scenario_check.py), which also checks the builder's faults. See chaos/scenario.py
for the file form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ground.processes import COORD, STORE

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
        return _validator(source, sites).scenario(data)

    # ---- the Python API: every method returns a new Scenario with one more fault ----------

    @staticmethod
    def build(name: str, description: str = "", *, seed: int = 0) -> "Scenario":
        """An empty scenario to chain faults onto (`.crash(...).blackhole(...)`)."""
        return _validator("<script>", None).scenario({"name": name, "description": description, "seed": seed})

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
        fault = _validator("<script>", sites).fault(raw, ("faults", len(self.faults)))
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
        """Latency/jitter/bandwidth/timeout/reset_peer/slicer toxics (see ground/faults.py FAULT_KINDS['link_degrade'])."""
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


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v



def _validator(source: str, sites: Iterable[str] | None) -> Any:
    from chaos.scenario_check import _Validator  # here: the validator builds these objects

    return _Validator(source, {}, sites)
