"""Typed, frozen run configuration.

Every knob of a run lives in one of these dataclasses, with units in field names.
The resolved config (defaults + file + CLI overrides) is written to every run directory,
checkpoint manifest and summary, so a number can always be traced back to its settings.
`load_config` turns a nested dict (from YAML/JSON) into a `RunConfig` and names the exact
field that is wrong when it is.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A config value is missing, unknown or of the wrong type; the message names the field."""


# The recovery policies (coordinator/recovery.py `Policy` has one member per name; a test checks).
PolicyName = Literal["stall", "restart", "elastic", "oracle"]
POLICIES: tuple[str, ...] = typing.get_args(PolicyName)


@dataclass(frozen=True)
class ModelConfig:
    """A small byte-level decoder-only transformer (about 0.85M parameters by default)."""

    vocab_size: int = 256  # bytes
    seq_len: int = 128  # tokens per sample window (predicted positions)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4


@dataclass(frozen=True)
class DataConfig:
    """The corpus: the source text of Python's standard library, present on every machine."""

    max_corpus_bytes: int = 3_000_000  # stop adding documents past this many bytes
    heldout_every_docs: int = 10  # every 10th document (by sorted path) is held out
    # Held-out NLL is measured on this many windows of seq_len tokens (x 128 = 16,384 tokens), spread
    # evenly over the whole held-out split: all 18 held-out documents at the defaults. Measured on a
    # model trained to NLL 2.42: standard error of the mean over windows 0.037 nats/token (0.023 at
    # 256 windows); SE of the DIFFERENCE between two models on these same windows 0.007; one
    # evaluation 0.65 CPU-s on one thread (256 windows: 1.3 s). See README "Evaluation and baselines".
    eval_windows: int = 128
    shuffle_seed: int = 1234  # permutation of canonical sample ids


@dataclass(frozen=True)
class ScheduledSetting:
    """One change of a scripted schedule (train.mode = scripted): from round `at_round`, or from the
    first round boundary at or past `at_useful_tokens`, train in (mode, inner_steps_h, compression).
    Exactly one trigger is set (the other stays -1)."""

    at_round: int = -1
    at_useful_tokens: int = -1
    mode: Literal["sync", "local"] = "local"
    inner_steps_h: int = 8
    compression: Literal["none", "fp16", "int8"] = "none"


@dataclass(frozen=True)
class AdaptiveConfig:
    """Thresholds of the adaptive controller (control/controller.py), with units in the names."""

    h_choices: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # allowed inner steps H (1 in sync mode)
    comm_fraction_max: float = 0.25  # T_comm may be at most this fraction of T_inner = H * t_step
    # Hysteresis: move to a smaller H only when the smaller H would keep comm under this
    # (stricter) fraction; a larger H is chosen as soon as comm_fraction_max is exceeded.
    comm_fraction_shrink: float = 0.1
    # Finished communication cycles IN THE CURRENT SETTING needed before any decision (so also the
    # cooldown after a change), and the most it reads (the newest ones).
    min_cycles: int = 3
    window_cycles: int = 3
    # No return to a setting the run left within this many cycles (hysteresis in time): a noisy
    # estimate near a threshold cannot make it oscillate between two settings.
    reverse_guard_cycles: int = 8
    max_goodput_cv: float = 0.5  # coefficient of variation of goodput above this = link in flux: abstain
    disagreement_cos_min: float = 0.2  # mean pseudo-gradient cosine below this: prefer a smaller H
    allow_sync: bool = True  # H = 1 means mode sync
    compression_when_h_max: Literal["none", "fp16", "int8"] = "int8"  # at the largest H and still comm-bound
    # Which rule decides: `comm_fraction` (issue 12's: keep the collective's share of a round inside
    # [comm_fraction_shrink, comm_fraction_max]; control/controller.py) or `progress_rate` (controller v2:
    # the setting with the most predicted learning per second; control/progress_rate.py). The fields
    # below are v2's.
    rule: Literal["comm_fraction", "progress_rate"] = "comm_fraction"
    # Prior learning per token of H local steps relative to sync: H ** -exponent. Measured on the
    # controller-heldout recipe (2 layers, 2 samples per site per step, 524,288 tokens) from the
    # calibration families' fixed H = 8 and H = 32 runs: see bench/results/token_efficiency.json.
    # (bench/results/token_efficiency.json: exponent 0.164; fp16 0.998; int8 1.0007, capped at 1. One seed:
    # priors, each a recipe property measured once.)
    token_efficiency_exponent: float = 0.164
    fp16_token_efficiency: float = 0.998
    int8_token_efficiency: float = 1.0
    # A learning floor (0 = none): only settings whose prior learning per token is at least
    # (1 - max_token_efficiency_loss) x that of local H = learning_reference_h, uncompressed, are chosen,
    # so the controller saves time and bytes without learning less per token than that reference.
    learning_reference_h: int = 0
    max_token_efficiency_loss: float = 0.0
    min_cycles_progress: int = 2  # cycles in the current setting before an after-cycle decision
    min_gain: float = 0.1  # predicted learning-per-second gain needed to change (hysteresis in level)
    overrun_factor: float = 4.0  # a round in flight this many times its prediction is acted on in the cycle
    min_overrun_s: float = 2.0  # ... and at least this many seconds over it (short rounds jitter)

    def __post_init__(self) -> None:
        checks = {"train.adaptive.h_choices": bool(self.h_choices) and all(h >= 1 for h in self.h_choices),
                  "train.adaptive.token_efficiency_exponent": 0.0 <= self.token_efficiency_exponent <= 2.0,
                  "train.adaptive.fp16_token_efficiency": 0.0 < self.fp16_token_efficiency <= 1.0,
                  "train.adaptive.int8_token_efficiency": 0.0 < self.int8_token_efficiency <= 1.0,
                  "train.adaptive.min_cycles_progress": self.min_cycles_progress >= 1,
                  "train.adaptive.min_gain": self.min_gain >= 0.0,
                  "train.adaptive.overrun_factor": self.overrun_factor > 1.0,
                  "train.adaptive.min_overrun_s": self.min_overrun_s >= 0.0,
                  "train.adaptive.learning_reference_h": self.learning_reference_h >= 0,
                  "train.adaptive.max_token_efficiency_loss": 0.0 <= self.max_token_efficiency_loss < 1.0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"{bad[0]} = {getattr(self, bad[0].rsplit('.', 1)[1])!r} is out of range "
                              f"(h_choices >= 1; exponent in [0, 2]; efficiencies in (0, 1]; min_cycles_progress "
                              f">= 1; min_gain >= 0; overrun_factor > 1; min_overrun_s >= 0; learning_reference_h >= 0; "
                              f"max_token_efficiency_loss in [0, 1))")


@dataclass(frozen=True)
class TrainConfig:
    """How the sites train together."""

    # sync | local: one consistency setting for the whole run (the fields below). scripted: the
    # settings of `settings_schedule`, each from its round or useful-token boundary on. adaptive: the
    # controller of control/controller.py picks them from measured observations (`adaptive`).
    mode: Literal["sync", "local", "scripted", "adaptive"] = "local"
    per_site_batch: int = 8  # samples per site per inner step
    inner_lr: float = 3e-3  # AdamW
    inner_weight_decay: float = 0.0
    inner_steps_h: int = 8  # DiLoCo H: inner steps between outer synchronisations (local mode)
    # Outer SGD on the averaged pseudo-gradient. At H <= 16 and ~50 rounds on this model, plain
    # averaging (lr 1.0, no momentum) learned most per token; the DiLoCo paper's (0.7, Nesterov
    # 0.9) is tuned for H ~ 500 and overshoots here (issue 10: 2.79 vs 2.41 nats after 1.18 M
    # tokens at H=8; (0.7, 0.5) 2.44). See bench/results/recipe_sweep.json.
    outer_lr: float = 1.0
    outer_momentum: float = 0.0  # Nesterov momentum of the outer SGD; 0 = plain SGD (no Nesterov)
    # Learning-rate schedule keyed to useful tokens (site_agent/lr_schedule.py): linear warm-up
    # over lr_warmup_tokens, then a half cosine to lr_floor_fraction x peak at lr_decay_tokens
    # (0 = target_useful_tokens). Every policy sees the same lr at the same frontier.
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    lr_warmup_tokens: int = 8_192
    lr_decay_tokens: int = 0
    lr_floor_fraction: float = 0.1
    outer_lr_scheduled: bool = False  # the outer lr follows the same schedule too
    target_useful_tokens: int = 65_536  # run ends once this many distinct tokens are retained
    eval_every_rounds: int = 4  # held-out NLL cadence, in rounds (sync: steps, local: outer rounds)
    checkpoint_every_rounds: int = 8
    compression: Literal["none", "fp16", "int8"] = "none"  # collective payload
    seed: int = 0  # model init
    # Start from a trained state instead of the seeded initial weights: a durable checkpoint of an earlier
    # run (its store directory, RUN/store, and the manifest's SHA-256; site_agent/init_state.py). Both or
    # neither; "" = the seeded weights. Its model, optimizer and outer state become the run's initial state.
    init_store_dir: str = ""
    init_manifest_sha256: str = ""
    threads_per_site: int = 0  # torch intra-op threads per site process; 0 = cores // sites, min 1
    # Emulated device speed: an inner step (a sync step) that computes faster than this waits out
    # the rest, so each site trains at a fixed rate however many sites share the host's cores. On
    # 2 cores three CPU-bound sites train no faster than two, so a missing site would cost nothing;
    # with a floor above the contended step time, it costs its share, as a datacenter would.
    # 0 = off (as fast as the host allows). Milliseconds per step.
    step_floor_ms: float = 0.0
    # Intra-site data parallelism: W processes per site (rank 0 = the site agent, the only one on
    # the WAN) joined by a per-site gloo group over loopback; each trains on 1/W of the site's
    # per_site_batch (must divide it) and they average grads every step. The site's thread budget
    # is split among them (min 1 each). 1 = the single-process site.
    workers_per_site: int = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # --- Consistency settings per epoch (issue 12, control/): used by mode scripted / adaptive.
    # Until the first scheduled change the run trains in (local, inner_steps_h, compression).
    settings_schedule: tuple[ScheduledSetting, ...] = ()
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)


@dataclass(frozen=True)
class LinkProfile:
    """One direction of one Toxiproxy proxy. 0 means unshaped. KB = 1000 bytes (Toxiproxy's unit)."""

    latency_ms: int = 0
    jitter_ms: int = 0
    bandwidth_kbps: int = 0  # kilobytes per second, per connection


@dataclass(frozen=True)
class LinkSpec:
    """Both directions of a directed link: `up` is client->server (the link's name order)."""

    up: LinkProfile = field(default_factory=LinkProfile)
    down: LinkProfile = field(default_factory=LinkProfile)


@dataclass(frozen=True)
class WanConfig:
    """The shaped WAN and the ZeroMQ transport over it."""

    site_link: LinkSpec = field(default_factory=lambda: LinkSpec(LinkProfile(20, 2, 0), LinkProfile(20, 2, 0)))
    service_link: LinkSpec = field(default_factory=lambda: LinkSpec(LinkProfile(5, 0, 0), LinkProfile(5, 0, 0)))
    # Per-link overrides, e.g. {"a_to_b": LinkSpec(...)}; stored as a tuple of pairs to stay hashable.
    link_overrides: tuple[tuple[str, LinkSpec], ...] = ()
    curve: bool = True  # CurveZMQ encryption + authentication with per-cluster keys
    max_frame_bytes: int = 8 * 1024 * 1024  # larger application frames are rejected
    max_header_bytes: int = 64 * 1024
    chunk_bytes: int = 1024 * 1024  # collective payloads are split into chunks of at most this
    heartbeat_interval_ms: int = 200
    heartbeat_timeout_ms: int = 3000
    retransmit_timeout_ms: int = 10_000  # no ack progress on a link for this long -> resend
    zmq_heartbeat_ivl_ms: int = 1000  # ZMTP PING, detects silent blackholes under live TCP
    # How long a connection may stay silent before ZMTP closes it (HEARTBEAT_TIMEOUT, and the TTL
    # told to the peer). Longer than any SIGSTOP a scenario gives a process (site_hang, store_outage
    # mode stop: at most 25 s): libzmq 4.3.5 can abort a process resumed after its peers closed its
    # connections during the stop (`!_io_error` in out_event, upstream issue #4841). A blackhole is
    # still noticed by the collective's stall detector, and when it heals the bytes it swallowed
    # break the stream, which ZMTP then resets.
    zmq_heartbeat_timeout_ms: int = 30_000
    linger_ms: int = 200
    collective_timeout_ms: int = 120_000
    # A peer that delivers nothing of a round for this long while we wait is reported unreachable
    # (a partition or a blackholed link, which heartbeats to the coordinator cannot see).
    collective_stall_ms: int = 15_000
    # Per destination, what a process holds for a peer that does not ack: past either bound, new reliable
    # messages for it are refused (logged) until it acks, so a member that asks and never acks cannot
    # make another process hold (and resend) its replies without end. Far above an honest peer's need.
    max_unacked_messages: int = 65_536
    max_unacked_mib: int = 2048

    def __post_init__(self) -> None:
        if self.zmq_heartbeat_ivl_ms > 0 and self.zmq_heartbeat_timeout_ms <= self.zmq_heartbeat_ivl_ms:
            raise ConfigError(f"wan.zmq_heartbeat_timeout_ms ({self.zmq_heartbeat_timeout_ms}) must exceed "
                              f"wan.zmq_heartbeat_ivl_ms ({self.zmq_heartbeat_ivl_ms})")


# recovery.warm_standby: after a standby became a site, the launcher starts the next one this much
# later (its preparation, a few CPU-seconds, would otherwise compete with the restarted site's first
# round on a small machine). The simulator models the same pool (sim/standby.py).
STANDBY_NEXT_AFTER_S = 10.0


@dataclass(frozen=True)
class RecoveryConfig:
    """How the cluster copes with a failed site (see coordinator/recovery.py)."""

    policy: PolicyName = "elastic"
    failure_confirm_ms: int = 0  # extra silence after the heartbeat timeout before a site is failed
    # A member whose connection to the coordinator closed and who sent nothing since is failed after
    # this long (a killed process closes its connections at once); 0 leaves only the heartbeat timeout.
    disconnect_grace_ms: int = 300
    # Native mode: the launcher keeps one warm standby site process (torch imported, model built and
    # warmed; site_agent/standby.py) and hands a chaos restart of a site to it instead of starting a
    # cold process. Needs train.workers_per_site = 1 (ignored otherwise).
    warm_standby: bool = False
    # Oracle only (filled from the scenario by `xdc compare` / `xdc run --scenario`):
    # (site, useful tokens at which its fault fires).
    oracle_faults: tuple[tuple[str, int], ...] = ()
    # Fault gates (ground/gates.py; filled from the scenario by the same commands): the useful tokens
    # of every `at_useful_tokens` fault trigger. A site whose round reaches one waits before its next
    # inner step until the chaos driver has injected that fault, so it lands at the same point of
    # training in every run; at most fault_gate_timeout_ms (then it goes on and says so).
    fault_gates: tuple[int, ...] = ()
    fault_gate_timeout_ms: int = 5000


@dataclass(frozen=True)
class ClusterConfig:
    sites: tuple[str, ...] = ("a", "b", "c")
    host: str = "127.0.0.1"
    # Native mode: site processes (first starts and chaos restarts) are forked from one server that
    # has already imported torch and the site code (cluster/forkserver.py), instead of each paying
    # Python's start and the torch import. Compose ignores it (a container is its own process).
    fork_server: bool = False
    # What the checkpoint store's blobs and uploads in progress may hold together (MiB); an upload past
    # it is refused with a clear error and nothing stored is touched.
    store_quota_mib: int = 16_384


@dataclass(frozen=True)
class EnergyInvalidators:
    """Meter-validity rules, frozen before any energy effect is read (telemetry/validity.py).

    When one fires, the claim it guards is withdrawn: its numbers stay visible as diagnostics only.
    """

    # Logger calibration: the 95th-percentile interval between polls may be at most this many poll periods.
    poll_max_p95_factor: float = 2.0
    # A power gauge whose value effectively changes less often than this many poll periods cannot be
    # integrated into energy (seed: polled every 20 ms, board power changed about every 495 ms).
    gauge_max_update_factor: float = 4.0
    # A cumulative energy counter must update at least this often (NVML's about every 100 ms).
    counter_max_update_ms: float = 250.0
    # A phase's energy needs at least this many counter updates inside the phase's time.
    counter_min_updates_per_phase: int = 3


@dataclass(frozen=True)
class TelemetryConfig:
    """The energy/telemetry sampler: one extra process per machine (telemetry/sampler.py)."""

    enabled: bool = True
    poll_period_ms: int = 20
    idle_baseline_s: float = 1.0  # sampled with the run's processes not running, before and after the run
    # The `modeled` CPU meter: measured CPU seconds of the run's processes x this declared power (`prior`).
    modeled_cpu_watts_per_core: float = 15.0
    process_scan_period_ms: int = 1000  # how often /proc is scanned for the run's processes
    rapl_root: str = "/sys/class/powercap"
    invalidators: EnergyInvalidators = field(default_factory=EnergyInvalidators)


@dataclass(frozen=True)
class RunConfig:
    run_id: str = ""
    runs_dir: str = "runs"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wan: WanConfig = field(default_factory=WanConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def link_spec(self, link_name: str) -> LinkSpec:
        for name, spec in self.wan.link_overrides:
            if name == link_name:
                return spec
        return self.wan.service_link if link_name.endswith(("_to_coord", "_to_store")) else self.wan.site_link


def to_dict(cfg: Any) -> Any:
    """Plain JSON-able form; link overrides become a mapping."""
    if dataclasses.is_dataclass(cfg):
        out = {}
        for f in dataclasses.fields(cfg):
            v = getattr(cfg, f.name)
            if f.name == "link_overrides":
                out[f.name] = {k: to_dict(s) for k, s in v}
            else:
                out[f.name] = to_dict(v)
        return out
    if isinstance(cfg, tuple):
        return [to_dict(x) for x in cfg]
    return cfg


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, where)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if where.endswith("link_overrides"):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of link name to {{up, down}}")
        return tuple((str(k), _coerce(LinkSpec, v, f"{where}.{k}")) for k, v in sorted(value.items()))
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]
            return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_coerce(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(args, value)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: type, data: dict, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown field(s) {unknown}; known: {sorted(names)}")
    kwargs = {k: _coerce(hints[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def load_config(data: dict | None = None) -> RunConfig:
    """Build a RunConfig from a nested dict; missing fields take their defaults."""
    return _build(RunConfig, data or {}, "")


def partial_link_notes(data: dict | None) -> list[str]:
    """Where `data` gives wan.site_link or wan.service_link in part, what that costs: a profile's
    fields left out (and a direction left out) are LinkProfile's, 0 ms and unshaped, not the
    link's default (site links 20 +- 2 ms, service links 5 ms). So
    `--set wan.site_link.up.bandwidth_kbps=1250` also makes both directions' latency 0. That meaning
    is kept (configs, benchmarks and frozen studies rely on it); the CLI shows these notes so that
    nobody loses the WAN's latency without knowing. One note per direction that loses a default."""
    wan = (data or {}).get("wan")
    if not isinstance(wan, dict):
        return []
    defaults, zero = WanConfig(), LinkProfile()
    names = [f.name for f in dataclasses.fields(LinkProfile)]
    out = []
    for link in ("site_link", "service_link"):
        spec = wan.get(link)
        if not isinstance(spec, dict):
            continue
        for direction in ("up", "down"):
            prof = spec.get(direction)
            if prof is not None and not isinstance(prof, dict):
                continue  # a type error load_config reports
            default = getattr(getattr(defaults, link), direction)
            lost = [k for k in names if (prof is None or k not in prof) and getattr(default, k) != getattr(zero, k)]
            if not lost:
                continue
            how = "not given" if prof is None else "given in part"
            out.append(f"wan.{link}.{direction} {how}: {', '.join(f'{k}=0' for k in lost)}, not the default's "
                       f"{', '.join(f'{k}={getattr(default, k)}' for k in lost)} (a link profile given in part takes 0 "
                       f"for what it leaves out; give {'them' if len(lost) > 1 else 'it'} to keep the default)")
    return out


def merge(base: dict, override: dict) -> dict:
    """Deep-merge two nested dicts (override wins)."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict:
    """`train.mode=sync` -> {"train": {"mode": "sync"}}; the value is parsed as JSON when it can be."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.mode=sync")
    key, raw = text.split("=", 1)
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def read_config_file(path: str | Path) -> dict:
    """Read a YAML or JSON config file into a dict (validated later by load_config)."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML/JSON: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))


def config_from_json(path: str | Path) -> RunConfig:
    return load_config(json.loads(Path(path).read_text()))
