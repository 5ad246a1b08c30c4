"""The scenario validator: a parsed tree (from YAML, TOML or the Python builder) into frozen
Scenario / Fault / Trigger objects, each error a ScenarioError naming file, line and dotted field.
It accepts exactly the kinds of the registry (ground/faults.py) and fills in their defaults.
Its generic checks are chaos/fields.py's (the study protocol's validator uses them too)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from chaos.fault_parts import TRIGGER_KEYS, Fault, Trigger
from chaos.fields import FieldChecker, FieldPath, tname
from ground.faults import FAULT_KINDS as KINDS
from ground.faults import NAME_RE as _NAME_RE
from ground.faults import SERVICES, SLICER_KEYS, FaultKind, parse_link_target
from ground.processes import COORD, STORE

FAULT_KEYS = ("kind", "target", *TRIGGER_KEYS, "duration_s", "heal", "params", "note")
TOP_KEYS = ("name", "description", "seed", "faults")

S = TypeVar("S")  # the Scenario class the validator makes (chaos/scenario_model.py imports this module)


class ScenarioValidator(FieldChecker, Generic[S]):
    """A scenario tree into a Scenario made by `make`, checking every fault against the registry."""

    def __init__(self, source: str, lines: Mapping[FieldPath, int], sites: Iterable[str] | None, *,
                 make: Callable[..., S]) -> None:
        super().__init__(source, lines)
        self.make = make
        self.sites = tuple(sites) if sites is not None else None

    # ---- pieces ------------------------------------------------------------------------

    def scenario(self, data: Any) -> S:
        d = self.mapping(data, (), "a scenario")
        self.unknown(d, TOP_KEYS, ())
        name = d.get("name", None if self.source.startswith("<") else Path(self.source).stem)
        if name is None:
            raise self.err(("name",), "missing: a scenario needs a name")
        if not isinstance(name, str) or not name.strip():
            raise self.err(("name",), f"expected a non-empty string, got {tname(name)} {name!r}")
        desc = d.get("description", "")
        if not isinstance(desc, str):
            raise self.err(("description",), f"expected a string, got {tname(desc)}")
        seed = self.number(d.get("seed", 0), ("seed",), integer=True, what="an integer")
        faults_raw = d.get("faults", [])
        if faults_raw is None:
            faults_raw = []
        if not isinstance(faults_raw, (list, tuple)):
            raise self.err(("faults",), f"expected a list of faults, got {tname(faults_raw)}")
        faults = tuple(self.fault(f, ("faults", i)) for i, f in enumerate(faults_raw))
        return self.make(name=name.strip(), description=" ".join(desc.split()), faults=faults, seed=seed)

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

    def target(self, kind: str, spec: FaultKind, raw: Any, path: FieldPath) -> str:
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
            raise self.err(tpath, f"expected a string, got {tname(raw)} {raw!r}")
        t = raw.strip()
        if spec.target in ("store", "coord"):
            if t != spec.target:
                raise self.err(tpath, f"{kind} acts on {spec.target!r}, not {t!r}")
            return t
        if spec.target == "site":
            if t in SERVICES:
                raise self.err(tpath, f"{kind} acts on a site, not the {t!r} service "
                                      f"(use {'store_outage' if t == STORE else 'coord_crash'})")
            if not _NAME_RE.fullmatch(t):
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

    def params(self, kind: str, spec: FaultKind, raw: Any, path: FieldPath) -> dict[str, Any]:
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
                    raise self.err(fp, f"expected true/false, got {tname(v)} {v!r}")
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
        floor = spec.duration_at_least
        if floor and duration is not None and duration < params[floor]:
            raise self.err((*path, "duration_s"), f"the site returns after {duration:g} s but its notice "
                                                  f"({floor}) is {params[floor]:g} s; use duration_s >= {floor}")
        note = d.get("note", "")
        if not isinstance(note, str):
            raise self.err((*path, "note"), f"expected a string, got {tname(note)}")
        return Fault(kind=kind, target=target, trigger=trig, duration_s=duration, heal=heal, params=params,
                     note=" ".join(note.split()))
