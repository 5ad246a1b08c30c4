"""A chaos scenario (a named, seeded tuple of faults) and its Python builder. Frozen; built only
through the validator (chaos/scenario_check.py), which also checks the builder's faults. The parts
(Trigger, Fault, ScenarioError) are in chaos/fault_parts.py; see chaos/scenario.py for the file form."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from chaos.fault_parts import Fault, Trigger
from chaos.scenario_check import ScenarioValidator
from ground.processes import COORD, STORE


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


def _validator(source: str, sites: Iterable[str] | None) -> ScenarioValidator[Scenario]:
    return ScenarioValidator(source, {}, sites, make=Scenario)
