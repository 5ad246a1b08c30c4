"""A study protocol: the question, the arms, the strata, the equal-work target, the metrics, the
invalidators, the frozen gates and the no-failure controls, read from a YAML file.

File form (see studies/protocols/*.yaml for complete ones):

    name: equal-work
    version: 1
    question: Does local mode keep learning at equal useful work?
    claim: Local mode is noninferior in held-out NLL and attempts fewer FLOPs.
    target_useful_tokens: 524288          # every run ends with exactly this many useful tokens
    base_config: {train: {...}, wan: {...}}   # run-config overrides common to every run
    arms:                                 # each a recovery policy, a consistency mode, more config
      - {name: sync, policy: elastic, mode: sync}
      - {name: local-h8, policy: elastic, mode: local, inner_steps_h: 8}
    contrast: {treatment: local-h8, control: sync}   # paired difference = treatment - control
    strata:                               # identical for every arm inside a stratum
      - {name: s0, seed: 0, data_order: 1234, faults: scenarios/one-outage.yaml,
         link: {latency_ms: 20, jitter_ms: 2, bandwidth_kbps: 5000}, split: heldout}
    metrics: [final_heldout_nll, progress_per_flop, attempted_flops, opportunity_ticks, ...]
    evaluation: {split: heldout}          # which strata the gates are decided on; unlearned_pairs: flag |
                                          # exclude (a pair whose runs both ended short of the bigram baseline)
    invalidators: [unclean_exit, target_not_reached, unequal_work, ...]
    gates:
      - {name: learning, metric: final_heldout_nll, kind: noninferiority, direction: lower,
         margin: 0.05, alpha: 0.05, test: sign_flip_exact}
    controls: {arms: [sync-elastic, sync-stall], strata: [s0], expect: identical}

A factorial study (studies/protocols/cadence-continuation.yaml) names more than two arms and its
`contrasts`, each a +/-1 weight vector over arms (weights sum to 0), evaluated per block (stratum):

    contrasts:
      - {name: interaction, weights: {dense-replay: -1, dense-continue: 1, sparse-replay: 1, sparse-continue: -1}}
    gates:
      - {name: interaction, contrast: interaction, metric: energy_j, kind: superiority, direction: higher, ...}

The control may be chosen by a frozen rule instead of named: the comparator is the candidate arm
with the best median of one metric over one split's strata (their runs with faults), decided from
those runs alone, so a held-out result cannot choose it:

    contrast: {treatment: adaptive,
               control: {choose_from: [fixed-local, sync], split: calibration, metric: opportunity_ticks,
                         direction: lower}}

A gate without `contrast` is on the treatment - control pair. `start_state` makes every run start from
one trained state: either `{store_dir, manifest_sha256}` (a durable checkpoint that exists) or
`{target_useful_tokens, config}` (the study first trains it once, without faults, and every run then
starts from that run's durable frontier; its manifest hash is recorded in every run).

`faults` is a scenario file (path relative to the protocol file, then to the repository root),
an inline scenario mapping (chaos/scenario.py's form), or absent/null (no faults).

Every error is a `ProtocolError` naming the file, the line and the dotted field, like scenario
errors: `studies/x.yaml:14: gates[0].alpha: must be < 1, got 1.5`. The run configs an arm
produces are checked by the config loader itself (`arm_configs`), never by a list kept here, so
an arm the loader does not accept yet (e.g. `mode: adaptive`) is refused with the loader's words.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

from chaos.fields import FieldChecker, FieldPath
from chaos.fields import dotted as _dotted
from chaos.fields import tname as _tname
from ground.config import POLICIES
from studies.protocol_model import (ARM_KEYS, Arm, COMPARATOR_KEYS, CONTRAST_KEYS, Comparator, Contrast, GATE_KEYS, GATE_KINDS, Gate, INVALIDATORS, LINK_KEYS, METRICS, Protocol, ProtocolError, ROOT, SPLITS, START_KEYS, UNLEARNED_PAIRS, STRATUM_KEYS, Stratum, TESTS, TOP_KEYS, _plain)

class _V(FieldChecker):
    """The validator: every check raises ProtocolError at the line of the path it checks. The line
    lookup and the mapping / unknown-field checks are chaos/fields.py's, shared with scenarios."""

    def __init__(self, source: str, lines: Mapping[FieldPath, int], base_dir: Path) -> None:
        super().__init__(source, lines)
        self.base_dir = base_dir

    def err(self, path: FieldPath, reason: str) -> ProtocolError:  # type: ignore[override]
        return ProtocolError(self.source, self.line(path), _dotted(path), reason)

    def seq(self, v: Any, path: FieldPath, what: str, min_len: int = 0) -> list[Any]:
        if not isinstance(v, (list, tuple)):
            raise self.err(path, f"expected {what} (a list), got {_tname(v)}")
        if len(v) < min_len:
            raise self.err(path, f"needs at least {min_len} item{'s' if min_len > 1 else ''}, got {len(v)}")
        return list(v)

    def required(self, d: Mapping[str, Any], key: str, path: FieldPath) -> Any:
        if key not in d:
            raise self.err((*path, key) if path else (key,), "missing (required)")
        return d[key]

    def text(self, v: Any, path: FieldPath, *, empty: bool = False) -> str:
        if not isinstance(v, str) or (not empty and not v.strip()):
            raise self.err(path, f"expected a non-empty string, got {_tname(v)} {v!r}")
        return v

    def integer(self, v: Any, path: FieldPath, minimum: int | None = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(path, f"expected an integer, got {_tname(v)} {v!r}")
        if minimum is not None and v < minimum:
            raise self.err(path, f"must be >= {minimum}, got {v!r}")
        return v

    def number(self, v: Any, path: FieldPath) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.err(path, f"expected a finite number, got {_tname(v)} {v!r}")
        return float(v)

    def choice(self, v: Any, path: FieldPath, choices: Iterable[str]) -> str:
        choices = list(choices)
        if v not in choices:
            hint = difflib.get_close_matches(str(v), choices, n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise self.err(path, f"{v!r} is not one of {choices}{extra}")
        return v

    # ---- pieces ----------------------------------------------------------------------------

    def arm(self, raw: Any, path: FieldPath) -> Arm:
        d = self.mapping(raw, path, "an arm")
        self.unknown(d, ARM_KEYS, path)
        name = self.text(self.required(d, "name", path), (*path, "name"))
        policy = self.choice(d.get("policy", "elastic"), (*path, "policy"), POLICIES)
        mode = d.get("mode")
        if mode is not None:  # its value is the config loader's to judge (arm_configs)
            mode = self.text(mode, (*path, "mode"))
        h = d.get("inner_steps_h")
        if h is not None:
            h = self.integer(h, (*path, "inner_steps_h"), minimum=1)
        cfg = self.mapping(d.get("config", {}) or {}, (*path, "config"), "run-config overrides")
        return Arm(name, policy, mode, h, dict(cfg), self.text(d.get("note", ""), (*path, "note"), empty=True))

    def generated(self, raw: Mapping[str, Any], path: FieldPath, seed: int, target: int) -> tuple[dict[str, Any], str]:
        """`{generator: <family>, severity: mild|severe}`: the scenario that stress family draws for the
        stratum's seed and the protocol's target (chaos/families.py), resolved here so it is hashed."""
        from chaos.families import FAMILIES, GENERATOR_VERSION, SEVERITIES, FamilyError, generate

        self.unknown(raw, ("generator", "severity"), path)
        family = self.choice(raw["generator"], (*path, "generator"), tuple(FAMILIES))
        severity = self.choice(raw.get("severity", "mild"), (*path, "severity"), SEVERITIES)
        try:
            sc = generate(family, severity, seed=seed, target_useful_tokens=target)
        except FamilyError as e:
            raise self.err(path, str(e)) from None
        return sc.to_dict(), f"generator:{family}/{severity}/seed {seed}/v{GENERATOR_VERSION}"

    def faults(self, raw: Any, path: FieldPath, seed: int = 0, target: int = 1) -> tuple[dict[str, Any] | None, str]:
        """A stratum's fault schedule: a scenario file, an inline scenario, a stress family's draw, or none."""
        from chaos.scenario import Scenario, ScenarioError, load_scenario

        if raw is None or raw == "none":
            return None, "none"
        if isinstance(raw, str):
            cands = [self.base_dir / raw, ROOT / raw]
            p = next((c for c in cands if c.is_file()), None)
            if p is None:
                raise self.err(path, f"scenario file {raw!r} not found (looked in {self.base_dir} and {ROOT})")
            try:
                sc = load_scenario(p)
            except ScenarioError as e:
                raise self.err(path, f"scenario file {raw!r} is invalid: {e}") from None
            return sc.to_dict(), raw
        if isinstance(raw, Mapping) and "generator" in raw:
            return self.generated(raw, path, seed, target)
        if isinstance(raw, Mapping):
            try:
                sc = Scenario.from_dict(raw, source=self.source)
            except ScenarioError as e:  # the inline scenario's own field, under this path
                inner = e.field
                where = path
                line = self.line(path)
                # locate the inner field's line through our line table
                parts: list[Any] = []
                for tok in inner.replace("]", "").replace("[", ".").split("."):
                    if tok:
                        parts.append(int(tok) if tok.isdigit() else tok)
                line = self.line((*path, *parts))
                raise ProtocolError(self.source, line, f"{_dotted(where)}.{inner}" if inner else _dotted(where),
                                    e.reason) from None
            return sc.to_dict(), "inline"
        raise self.err(path, f"expected a scenario file name, an inline scenario mapping or null, got {_tname(raw)}")

    def stratum(self, raw: Any, path: FieldPath, target: int = 1) -> Stratum:
        d = self.mapping(raw, path, "a stratum")
        self.unknown(d, STRATUM_KEYS, path)
        name = self.text(self.required(d, "name", path), (*path, "name"))
        seed = self.integer(d.get("seed", 0), (*path, "seed"))
        order = self.integer(d.get("data_order", 1234), (*path, "data_order"))
        faults, src = self.faults(d.get("faults"), (*path, "faults"), seed, target)
        link = d.get("link")
        if link is not None:
            link = self.mapping(link, (*path, "link"), "a link profile")
            self.unknown(link, LINK_KEYS, (*path, "link"))
            link = {k: self.integer(v, (*path, "link", k)) for k, v in link.items()}
        split = self.choice(d.get("split", "heldout"), (*path, "split"), SPLITS)
        family = self.text(d.get("family", ""), (*path, "family"), empty=True)
        if src.startswith("generator:"):
            drawn_by = src.split(":", 1)[1].split("/", 1)[0]
            if family and family != drawn_by:
                raise self.err((*path, "family"), f"{family!r} differs from the family whose generator draws this "
                                                  f"stratum's faults ({drawn_by!r})")
            family = drawn_by
        region = dict(self.mapping(d.get("region", {}) or {}, (*path, "region"), "uncertainty-region labels"))
        return Stratum(name, seed, order, faults, src, link, split, family, region)

    def gate(self, raw: Any, path: FieldPath) -> Gate:
        d = self.mapping(raw, path, "a gate")
        self.unknown(d, GATE_KEYS, path)
        name = self.text(self.required(d, "name", path), (*path, "name"))
        metric = self.choice(self.required(d, "metric", path), (*path, "metric"), METRICS)
        kind = self.choice(self.required(d, "kind", path), (*path, "kind"), GATE_KINDS)
        direction = self.choice(self.required(d, "direction", path), (*path, "direction"), ("lower", "higher"))
        margin = self.number(d.get("margin", 0), (*path, "margin"))
        if margin < 0:
            raise self.err((*path, "margin"), f"must be >= 0 (it is in the metric's own unit), got {margin:g}")
        if kind == "superiority" and margin != 0:
            raise self.err((*path, "margin"), "a superiority gate has margin 0; use kind: noninferiority for a margin")
        alpha = self.number(self.required(d, "alpha", path), (*path, "alpha"))
        if not 0 < alpha < 1:
            raise self.err((*path, "alpha"), f"must be > 0 and < 1, got {alpha:g}")
        test = self.choice(d.get("test", "sign_flip_exact"), (*path, "test"), TESTS)
        relative = d.get("relative", False)
        if not isinstance(relative, bool):
            raise self.err((*path, "relative"), f"expected true/false, got {_tname(relative)} {relative!r}")
        contrast = self.text(d.get("contrast", ""), (*path, "contrast"), empty=True)
        return Gate(name, metric, kind, direction, margin, alpha, test,
                    self.text(d.get("note", ""), (*path, "note"), empty=True), relative, contrast)

    def contrast(self, raw: Any, path: FieldPath, arms: list[str]) -> Contrast:
        d = self.mapping(raw, path, "a contrast")
        self.unknown(d, CONTRAST_KEYS, path)
        name = self.text(self.required(d, "name", path), (*path, "name"))
        w = self.mapping(self.required(d, "weights", path), (*path, "weights"), "weights over arms")
        weights: dict[str, int] = {}
        for a, v in w.items():
            self.choice(a, (*path, "weights", a), arms)
            if isinstance(v, bool) or v not in (-1, 1):
                raise self.err((*path, "weights", a), f"a weight is +1 or -1 (leave an arm out for 0), got {v!r}")
            weights[str(a)] = int(v)
        if sum(weights.values()) != 0 or not weights:
            raise self.err((*path, "weights"), f"the weights must sum to 0 (as many +1 as -1 arms), got "
                                               f"{sum(weights.values()):+d} over {len(weights)} arms")
        return Contrast(name, weights, self.text(d.get("note", ""), (*path, "note"), empty=True))

    def start_state(self, raw: Any) -> dict[str, Any]:
        from checkpoint_store.blobstore import is_sha256_hex

        path: FieldPath = ("start_state",)
        d = dict(self.mapping(raw, path, "the start state"))
        self.unknown(d, START_KEYS, path)
        if "manifest_sha256" in d or "store_dir" in d:
            self.text(self.required(d, "store_dir", path), (*path, "store_dir"))
            if not is_sha256_hex(self.required(d, "manifest_sha256", path)):
                raise self.err((*path, "manifest_sha256"), f"expected a SHA-256 (64 lowercase hex), got "
                                                           f"{d['manifest_sha256']!r}")
            if "target_useful_tokens" in d or "config" in d:
                raise self.err(path, "either an existing checkpoint (store_dir, manifest_sha256) or a run that "
                                     "trains it (target_useful_tokens, config), not both")
            return d
        self.integer(self.required(d, "target_useful_tokens", path), (*path, "target_useful_tokens"), minimum=1)
        d["config"] = dict(self.mapping(d.get("config", {}) or {}, (*path, "config"), "run-config overrides"))
        return d

    def protocol(self, data: Any) -> Protocol:
        d = self.mapping(data, (), "a protocol")
        self.unknown(d, TOP_KEYS, ())
        name = self.text(self.required(d, "name", ()), ("name",))
        version = self.integer(d.get("version", 1), ("version",), minimum=1)
        question = self.text(self.required(d, "question", ()), ("question",))
        claim = self.text(self.required(d, "claim", ()), ("claim",))
        target = self.integer(self.required(d, "target_useful_tokens", ()), ("target_useful_tokens",), minimum=1)
        base = dict(self.mapping(d.get("base_config", {}) or {}, ("base_config",), "run-config overrides"))
        arms_raw = self.seq(self.required(d, "arms", ()), ("arms",), "arms", min_len=2)
        arms = tuple(self.arm(a, ("arms", i)) for i, a in enumerate(arms_raw))
        self._unique([a.name for a in arms], "arms")
        names = [a.name for a in arms]
        c = self.mapping(self.required(d, "contrast", ()), ("contrast",), "the contrast")
        self.unknown(c, ("treatment", "control"), ("contrast",))
        treatment = self.choice(self.required(c, "treatment", ("contrast",)), ("contrast", "treatment"), names)
        strata_raw = self.seq(self.required(d, "strata", ()), ("strata",), "strata", min_len=1)
        strata = tuple(self.stratum(s, ("strata", i), target) for i, s in enumerate(strata_raw))
        self._unique([s.name for s in strata], "strata")
        metrics = tuple(self.choice(m, ("metrics", i), METRICS)
                        for i, m in enumerate(self.seq(d.get("metrics", list(METRICS)), ("metrics",), "metrics")))
        raw_control = self.required(c, "control", ("contrast",))
        comparator = None
        if isinstance(raw_control, Mapping):
            comparator = self.comparator(raw_control, names, treatment, strata, metrics)
            control = comparator.choose_from[0]
        else:
            control = self.choice(raw_control, ("contrast", "control"), names)
            if treatment == control:
                raise self.err(("contrast", "control"), "the control must be another arm than the treatment")
        ev = self.mapping(d.get("evaluation", {}) or {}, ("evaluation",), "the evaluation")
        self.unknown(ev, ("split", "unlearned_pairs"), ("evaluation",))
        split = self.choice(ev.get("split", "heldout"), ("evaluation", "split"), SPLITS)
        unlearned = self.choice(ev.get("unlearned_pairs", "flag"), ("evaluation", "unlearned_pairs"), UNLEARNED_PAIRS)
        if not any(s.split == split for s in strata):
            raise self.err(("evaluation", "split"), f"no stratum is in the {split!r} split")
        if comparator is not None and comparator.split == split:
            raise self.err(("contrast", "control", "split"), f"the comparator must be chosen on another split than "
                                                             f"the one the gates are decided on ({split!r})")
        inval = tuple(self.choice(x, ("invalidators", i), INVALIDATORS) for i, x in
                      enumerate(self.seq(d.get("invalidators", list(INVALIDATORS)), ("invalidators",), "invalidators")))
        contrasts = tuple(self.contrast(c, ("contrasts", i), names) for i, c in
                          enumerate(self.seq(d.get("contrasts", []) or [], ("contrasts",), "contrasts")))
        self._unique([c.name for c in contrasts], "contrasts")
        gates_raw = self.seq(self.required(d, "gates", ()), ("gates",), "gates", min_len=1)
        gates = tuple(self.gate(g, ("gates", i)) for i, g in enumerate(gates_raw))
        self._unique([g.name for g in gates], "gates")
        for i, g in enumerate(gates):
            if g.metric not in metrics:
                raise self.err(("gates", i, "metric"), f"{g.metric!r} is not among the protocol's metrics {list(metrics)}")
            if g.contrast:
                c = self.choice(g.contrast, ("gates", i, "contrast"), [x.name for x in contrasts])
                con = next(x for x in contrasts if x.name == c)
                if g.relative and len(con.weights) != 2:
                    raise self.err(("gates", i, "relative"), f"a relative gate needs a two-arm contrast (treatment / "
                                                             f"control - 1); {c!r} has {len(con.weights)} arms")
        start = self.start_state(d["start_state"]) if d.get("start_state") is not None else None
        controls = d.get("controls")
        if controls is not None:
            controls = self._controls(controls, names, [s.name for s in strata])
        notes = self.text(d.get("notes", ""), ("notes",), empty=True)
        return Protocol(name, version, question, claim, target, base, arms, treatment, control, strata, metrics,
                        split, inval, gates, controls, self.source, self.lines, notes, contrasts, start, comparator,
                        unlearned)

    def comparator(self, d: Mapping[str, Any], arms: list[str], treatment: str, strata: tuple[Stratum, ...],
                   metrics: tuple[str, ...]) -> Comparator:
        path: FieldPath = ("contrast", "control")
        self.unknown(d, COMPARATOR_KEYS, path)
        cands = [self.choice(x, (*path, "choose_from", i), arms) for i, x in
                 enumerate(self.seq(self.required(d, "choose_from", path), (*path, "choose_from"), "candidate arms", 1))]
        if treatment in cands:
            raise self.err((*path, "choose_from"), f"the treatment {treatment!r} cannot be its own comparator")
        for i, x in enumerate(cands):
            if x in cands[:i]:
                raise self.err((*path, "choose_from", i), f"{x!r} is named twice")
        split = self.choice(self.required(d, "split", path), (*path, "split"), SPLITS)
        if not any(s.split == split for s in strata):
            raise self.err((*path, "split"), f"no stratum is in the {split!r} split to choose the comparator on")
        metric = self.choice(self.required(d, "metric", path), (*path, "metric"), metrics)
        direction = self.choice(self.required(d, "direction", path), (*path, "direction"), ("lower", "higher"))
        return Comparator(tuple(cands), split, metric, direction)

    def _controls(self, raw: Any, arms: list[str], strata: list[str]) -> dict[str, Any]:
        d = self.mapping(raw, ("controls",), "the no-failure controls")
        self.unknown(d, ("arms", "strata", "expect"), ("controls",))
        a = [self.choice(x, ("controls", "arms", i), arms)
             for i, x in enumerate(self.seq(self.required(d, "arms", ("controls",)), ("controls", "arms"), "arms", 1))]
        s = [self.choice(x, ("controls", "strata", i), strata) for i, x in
             enumerate(self.seq(self.required(d, "strata", ("controls",)), ("controls", "strata"), "strata", 1))]
        expect = self.choice(d.get("expect", "identical"), ("controls", "expect"), ("identical", "report"))
        return {"arms": a, "strata": s, "expect": expect}

    def _unique(self, names: list[str], where: str) -> None:
        seen: set[str] = set()
        for i, n in enumerate(names):
            if n in seen:
                raise self.err((where, i, "name"), f"duplicate name {n!r}")
            seen.add(n)


def parse_protocol(text: str, source: str = "<string>", base_dir: Path | None = None) -> Protocol:
    from chaos.scenario import ScenarioError
    from chaos.scenario_text import _yaml_tree  # the same line-marked YAML reader as scenarios

    try:
        data, lines = _yaml_tree(text, source)
    except ScenarioError as e:
        raise ProtocolError(source, e.line, e.field, e.reason) from None
    return _V(source, lines, base_dir or ROOT).protocol(data if data is not None else {})


def load_protocol(path: str | Path) -> Protocol:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ProtocolError(str(p), None, "", f"cannot read protocol file: {e.strerror or e}") from None
    return parse_protocol(text, str(p), p.resolve().parent)


# ------------------------------------------------------------------------------ run configs


def stratum_overrides(p: Protocol, s: Stratum) -> dict[str, Any]:
    out: dict[str, Any] = {"train": {"seed": s.seed, "target_useful_tokens": p.target_useful_tokens},
                           "data": {"shuffle_seed": s.data_order}}
    if s.link is not None:
        prof = dict(s.link)
        out["wan"] = {"site_link": {"up": prof, "down": prof}}
    return out


def arm_overrides(a: Arm) -> dict[str, Any]:
    from ground.config import merge

    out: dict[str, Any] = {"recovery": {"policy": a.policy}}
    train: dict[str, Any] = {}
    if a.mode is not None:
        train["mode"] = a.mode
    if a.inner_steps_h is not None:
        train["inner_steps_h"] = a.inner_steps_h
    if train:
        out["train"] = train
    return merge(dict(a.config), out)


def run_config_dict(p: Protocol, s: Stratum, a: Arm) -> dict[str, Any]:
    """base_config < stratum < arm: the config dict of one run (not yet validated)."""
    from ground.config import merge

    return merge(merge(dict(_plain(p.base_config)), stratum_overrides(p, s)), arm_overrides(a))


def arm_configs(p: Protocol) -> dict[str, Any]:
    """{arm: RunConfig of the first stratum}; a config the loader refuses raises ProtocolError at
    that arm's line with the loader's own message (e.g. a mode it does not accept yet)."""
    from ground.config import ConfigError, load_config

    out = {}
    for i, a in enumerate(p.arms):
        try:
            for s in p.strata:
                cfg = load_config(run_config_dict(p, s, a))
            out[a.name] = cfg
        except ConfigError as e:
            v = _V(p.source, p.lines, ROOT)
            field_ = "mode" if a.mode is not None and "mode" in str(e) else "config"
            raise v.err(("arms", i, field_), f"arm {a.name!r} is refused by the run-config loader: {e}") from None
    return out
