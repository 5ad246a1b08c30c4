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
        params: {restart: true}     # per kind, see ground/faults.py

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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from chaos.scenario_check import ScenarioValidator
from chaos.fault_parts import Fault, ScenarioError, Trigger
from chaos.scenario_model import Scenario
from chaos.scenario_text import _toml_lines, _yaml_tree

# The scenario API: the frozen objects live in chaos/scenario_model.py, the checks in scenario_check.py.
__all__ = ["Fault", "Scenario", "ScenarioError", "Trigger", "load_scenario", "parse_scenario", "unreachable_triggers"]

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


# ------------------------------------------------------------------------------ files


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
    return ScenarioValidator(source, lines, sites, make=Scenario).scenario(data)


def load_scenario(path: str | Path, sites: Iterable[str] | None = None) -> Scenario:
    """Load a scenario file: `.toml` is TOML, anything else YAML. With `sites`, targets are checked
    against them. A file without `name:` is named after its stem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(str(p), None, "", f"cannot read scenario file: {e.strerror or e}") from None
    return parse_scenario(text, str(p), fmt="toml" if p.suffix.lower() == ".toml" else "yaml", sites=sites)
