"""Chaos scenarios' parts: a Trigger (when), a Fault (what, where, how long) and the ScenarioError
every check raises. Frozen value objects, below both the validator (chaos/scenario_check.py) and
the Scenario with its builder (chaos/scenario_model.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

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


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v
