"""A study protocol's value objects: arms, strata, gates, contrasts, the comparator rule and the
protocol itself, with the vocabularies a protocol file may use. Frozen; built by the validator in
studies/protocol.py, whose docstring describes the file form."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from chaos.fields import FieldPath


ROOT = Path(__file__).resolve().parent.parent

METRICS = ("final_heldout_nll", "progress_per_flop", "attempted_flops", "opportunity_ticks", "wall_s",
           "inter_site_bytes", "replayed_tokens", "energy_j", "energy_checkpoint_j", "energy_replay_j")
ENERGY_METRICS = ("energy_j", "energy_checkpoint_j", "energy_replay_j")
INVALIDATORS = ("unclean_exit", "target_not_reached", "unequal_work", "work_unbalanced", "faults_never_fired",
                "mixed_code_revisions", "eval_set_mismatch", "energy_meter_invalid", "start_state_mismatch")
SPLITS = ("heldout", "calibration")
UNLEARNED_PAIRS = ("flag", "exclude")
GATE_KINDS = ("noninferiority", "superiority")
TESTS = ("sign_flip_exact",)
TOP_KEYS = ("name", "version", "question", "claim", "target_useful_tokens", "base_config", "arms", "contrast",
            "strata", "metrics", "evaluation", "invalidators", "gates", "controls", "notes", "contrasts", "start_state")
ARM_KEYS = ("name", "policy", "mode", "inner_steps_h", "config", "note")
STRATUM_KEYS = ("name", "seed", "data_order", "faults", "link", "split", "family", "region")
GATE_KEYS = ("name", "metric", "kind", "direction", "margin", "alpha", "test", "relative", "note", "contrast")
CONTRAST_KEYS = ("name", "weights", "note")
COMPARATOR_KEYS = ("choose_from", "split", "metric", "direction")
START_KEYS = ("store_dir", "manifest_sha256", "target_useful_tokens", "config")
LINK_KEYS = ("latency_ms", "jitter_ms", "bandwidth_kbps")



class ProtocolError(ValueError):
    """A protocol is invalid: str() is `file:line: field: reason` (line omitted when unknown)."""

    def __init__(self, file: str, line: int | None, field_path: str, reason: str) -> None:
        self.file, self.line, self.field, self.reason = file, line, field_path, reason
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {field_path}: {reason}" if field_path else f"{where}: {reason}")


@dataclass(frozen=True)
class Arm:
    name: str
    policy: str = "elastic"
    mode: str | None = None  # train.mode; None = the base config's
    inner_steps_h: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    note: str = ""


@dataclass(frozen=True)
class Stratum:
    """What every arm shares inside one pair: model-init seed, data order, fault schedule, link."""

    name: str
    seed: int = 0  # train.seed
    data_order: int = 1234  # data.shuffle_seed
    faults: Mapping[str, Any] | None = field(default=None, hash=False)  # a scenario dict (resolved)
    faults_source: str = ""  # the file it came from, or "inline" / "none"
    link: Mapping[str, int] | None = field(default=None, hash=False)  # both directions of every site link
    split: str = "heldout"
    family: str = ""
    region: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Gate:
    name: str
    metric: str
    kind: str  # noninferiority | superiority
    direction: str  # which is better for the treatment: "lower" | "higher"
    margin: float
    alpha: float
    test: str = "sign_flip_exact"
    note: str = ""
    relative: bool = False  # the paired difference is treatment / control - 1 (margin as a fraction)
    contrast: str = ""  # a named contrast of the protocol; "" = the treatment - control pair


@dataclass(frozen=True)
class Comparator:
    """The rule that chooses the control: the candidate with the best median `metric` (`direction`:
    which is better) over the `split` strata's runs with faults (studies/artifact.py `choose_control`)."""

    choose_from: tuple[str, ...]
    split: str
    metric: str
    direction: str

    def to_dict(self) -> dict[str, Any]:
        return {"choose_from": list(self.choose_from), "split": self.split, "metric": self.metric,
                "direction": self.direction}


@dataclass(frozen=True)
class Contrast:
    """A +/-1 weight vector over arms: per block, sum_a w_a * metric(a)."""

    name: str
    weights: Mapping[str, int] = field(default_factory=dict, hash=False)
    note: str = ""

    @property
    def plus(self) -> list[str]:
        return [a for a, w in self.weights.items() if w > 0]

    @property
    def minus(self) -> list[str]:
        return [a for a, w in self.weights.items() if w < 0]


@dataclass(frozen=True)
class Protocol:
    name: str
    version: int
    question: str
    claim: str
    target_useful_tokens: int
    base_config: Mapping[str, Any]
    arms: tuple[Arm, ...]
    treatment: str
    control: str
    strata: tuple[Stratum, ...]
    metrics: tuple[str, ...]
    evaluation_split: str
    invalidators: tuple[str, ...]
    gates: tuple[Gate, ...]
    controls: Mapping[str, Any] | None
    source: str
    lines: Mapping[FieldPath, int] = field(default_factory=dict, hash=False, compare=False, repr=False)
    notes: str = ""
    contrasts: tuple[Contrast, ...] = ()
    start_state: Mapping[str, Any] | None = field(default=None, hash=False)
    # The rule that chooses `control` (None: the control is named). Until it is decided, `control` is
    # the first candidate; studies/artifact.py decides it from the runs and replaces `control`.
    comparator: Comparator | None = None
    # A pair whose two runs both ended short of the bigram baseline says nothing about learning:
    # "flag" makes a learning gate over it vacuous; "exclude" leaves it out of the learning gates
    # (reported), decided before the runs like everything else here.
    unlearned_pairs: str = "flag"

    def contrast(self, name: str) -> Contrast:
        return next(c for c in self.contrasts if c.name == name)

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    def to_dict(self) -> dict[str, Any]:
        """The canonical, normalised form (defaults filled, scenario files resolved): what is hashed."""
        return {
            "name": self.name, "version": self.version, "question": self.question, "claim": self.claim,
            "target_useful_tokens": self.target_useful_tokens, "base_config": _plain(self.base_config),
            "arms": [{"name": a.name, "policy": a.policy, "mode": a.mode, "inner_steps_h": a.inner_steps_h,
                      "config": _plain(a.config), "note": a.note} for a in self.arms],
            "contrast": {"treatment": self.treatment,
                         "control": self.comparator.to_dict() if self.comparator else self.control},
            "strata": [{"name": s.name, "seed": s.seed, "data_order": s.data_order, "faults": _plain(s.faults),
                        "faults_source": s.faults_source, "link": _plain(s.link), "split": s.split,
                        "family": s.family, "region": _plain(s.region)} for s in self.strata],
            "metrics": list(self.metrics),
            "evaluation": {"split": self.evaluation_split,
                           # only when set: the canonical form (and the hash) of earlier protocols is unchanged
                           **({"unlearned_pairs": self.unlearned_pairs} if self.unlearned_pairs != "flag" else {})},
            "invalidators": list(self.invalidators),
            "gates": [{"name": g.name, "metric": g.metric, "kind": g.kind, "direction": g.direction,
                       "margin": g.margin, "alpha": g.alpha, "test": g.test, "note": g.note, "relative": g.relative,
                       **({"contrast": g.contrast} if g.contrast else {})}
                      for g in self.gates],
            "controls": _plain(self.controls), "notes": self.notes,
            # only when used: the canonical form (and so the hash) of a paired protocol is unchanged
            **({"contrasts": [{"name": c.name, "weights": dict(c.weights), "note": c.note} for c in self.contrasts]}
               if self.contrasts else {}),
            **({"start_state": _plain(self.start_state)} if self.start_state else {}),
        }


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and v.is_integer():
        return int(v) if abs(v) < 2**53 else v
    return v
