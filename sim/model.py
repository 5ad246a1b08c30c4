"""The simulator's timing model: what the emulator measures, the simulator computes from these.

`SimModel` is frozen; every parameter has a unit in its name and an evidence class in
`EVIDENCE` ("prior" until sim/calibrate.py fits it from emulator runs, then "fitted"). Link
latency and bandwidth are not here: they come from the run config's link profiles
(`RunConfig.link_spec`), as Toxiproxy gets them in the emulator.

The collective is modeled as the emulator's collective behaves (site_agent/collective.py):
a direct reduce-scatter then an all-gather over the full mesh; each phase sends one shard of
P/n values to each of the n-1 peers at once over separate links, cut into parts of at most
`chunk_bytes`. Time = 2 phases x (one-way latency + shard bytes / per-link bandwidth + parts x
per-part overhead), the slowest link of each phase governing it, plus the round's end on the sites
(`collective_end_s`): a fixed part and a part per peer. The emulator's sites end a round together
(the collective's framing, the outer step, the parameters' hash, the report), all n processes on one
machine's cores, so the end takes longer with every member: fitted, 17 ± 7 ms a peer on two cores
(sim/calibrate.py fits both parts from rounds of two and of three members). A deployment with a
machine per site would not pay the shared cores; the prior is no per-peer part. A simulated
`collective` span ends where the next round's compute begins: it holds what the emulator does
between its collective span and its next compute span (20-40 ms: the outer step, the report).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from control.observations import SiteCycle
from ground.config import ModelConfig, RunConfig

# The tied-head TinyGPT of site_agent/model.py, by formula (checked against an emulator run's
# logged n_params = 842,496 and flops_per_token = 5,832,704 for the default ModelConfig).
BYTES_PER_VALUE = {"none": 4, "fp16": 2, "int8": 1}
NOT_PARAMETERS = frozenset({"evidence", "sources", "learning"})  # SimModel fields that are not timing parameters


def n_params(m: ModelConfig) -> int:
    d, layers = m.d_model, m.n_layers
    return m.vocab_size * d + m.seq_len * d + layers * (12 * d * d + 13 * d) + 2 * d


def flops_per_token(m: ModelConfig) -> float:
    """Forward + backward FLOPs per token: 6 x matmul parameters + the attention term (14 L T d)."""
    matmul = m.n_layers * 12 * m.d_model ** 2 + m.vocab_size * m.d_model
    return float(6 * matmul + 14 * m.n_layers * m.seq_len * m.d_model)


@dataclass(frozen=True)
class SimModel:
    # Compute: one inner step of per_site_batch x seq_len tokens (1 CPU thread, the emulator's default).
    compute_s_per_token: float = 0.5 / 1024  # seconds per trained token per inner step
    collective_part_overhead_s: float = 0.002  # per message part (framing, ack, CurveZMQ)
    collective_cpu_s: float = 0.03  # the round's end on the sites (reduce, apply, report): its fixed part
    collective_per_peer_s: float = 0.0  # ... and its part per other member (the emulator's shared cores)
    # Checkpoints: the leader writes model + inner optimiser + outer state to the store.
    checkpoint_write_bytes_per_s: float = 20e6
    checkpoint_read_bytes_per_s: float = 20e6
    checkpoint_fixed_s: float = 0.2
    # Process restart: interpreter + torch import + corpus load before the join is sent.
    restart_s: float = 8.0
    start_s: float = 8.0  # the first start of every site, before it joins
    # recovery.warm_standby (sim/standby.py): a standby's preparation from its start, and a restart
    # handed to a prepared standby -> its join (the name on stdin, then the join).
    standby_prepare_s: float = 8.0
    standby_restart_s: float = 0.15
    eval_s: float = 1.2  # the leader's held-out evaluation (background: does not delay training)
    # A state transfer (donor -> joiner) uses the site link's bandwidth; this is its fixed cost.
    state_transfer_fixed_s: float = 0.3
    # Heartbeats delivered to the coordinator (None: the config's interval, as the emulator).
    # At scale a live site's heartbeats are coalesced: on_heartbeat keeps only the last time.
    heartbeat_period_ms: int | None = None
    # SIGTERM -> the agent notices it at its next check (an inner step at most) and announces.
    preempt_exit_s: float = 0.2
    # Chaos driver: how long after the triggering commit a progress-triggered fault fires. With
    # fault gates (ground/gates.py) the sites wait meanwhile: it adds to the time, not to the work.
    fault_poll_s: float = 0.5
    # SIGKILL (site_crash) -> the killed process has exited and its connections close: the compute
    # stops at the kill, the coordinator's disconnect grace starts at the exit. Prior 0: they close
    # at the kill (fitted from calibration runs with a crash: the crash action's SIGKILL -> exit).
    crash_teardown_s: float = 0.0
    # SIGKILL -> the coordinator sees the killed site's connection close (its `peer_disconnected`): its
    # disconnect grace starts then. The driver sees the exit later (it polls for it): on this machine
    # the close came 37-44 ms after the SIGKILL and the driver's `crash_teardown_s` 64-68 ms. None
    # (the prior): at the teardown's end.
    crash_close_s: float | None = None
    # After a cut link heals: ZeroMQ reconnects (RECONNECT_IVL 40 ms) and the CurveZMQ handshake
    # runs before the WAN endpoint resends what was not acknowledged.
    reconnect_s: float = 0.05
    # A killed checkpoint store started again: interpreter start and reading its manifests back.
    store_restart_s: float = 1.0
    # A killed coordinator started again: interpreter start (no torch) and reading its journal.
    coord_restart_s: float = 1.5
    # The pseudo-gradient agreement the adaptive controller reads (cosine with the mean).
    update_cosine: float = 0.9
    # Wire sizes for the modeled WAN byte counters (sim/wan_bytes.py), bytes as the emulator counts
    # them (header, payload, ZeroMQ and CurveZMQ framing). Priors: a collective part and an ack
    # encoded by wan.frames with a representative header; a heartbeat and a reliable control message
    # measured once (least squares over make sim-validate's 28 emulator runs at 72f2283: heartbeats
    # are small, round reports carry their sample ids; one mean for both was 1.5-4.7 % off where
    # longer rounds change the mix).
    frame_overhead_bytes: float = 333.0  # per payload message, beyond its payload
    ack_bytes: float = 157.0
    control_message_bytes: float = 560.0  # mean of the reliable control messages (reports, plans, joins)
    heartbeat_message_bytes: float = 190.0  # a heartbeat (unreliable: never acked)
    telemetry_message_bytes: float = 180.0
    # The checkpoint store's small reliable messages (class checkpoint): a blob's finish, the manifest,
    # a range request and their replies (checkpoint_store/client.py). Prior: the emulator's replies
    # measured once (11,043 B in 40 messages).
    store_message_bytes: float = 276.0
    evidence: Mapping[str, str] = field(default_factory=dict, compare=False)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    # The learning curve (sim/learning_fit.py LearningCurve.to_json()); None: the prior.
    learning: Mapping[str, Any] | None = field(default=None, compare=False)

    def evidence_of(self, name: str) -> str:
        return self.evidence.get(name, "prior")

    def to_json(self) -> dict[str, Any]:
        params = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_PARAMETERS}
        return {"parameters": {k: {"value": v, "evidence": self.evidence_of(k),
                                   "source": self.sources.get(k, "prior: a guess from one loaded emulator run")}
                               for k, v in params.items()}}

    @staticmethod
    def from_calibration(doc: Mapping[str, Any], base: "SimModel | None" = None) -> "SimModel":
        """A model with the fitted parameters of a calibration file (sim/calibrate.py) applied."""
        base = base or SimModel()
        names = {f.name for f in fields(SimModel)} - NOT_PARAMETERS
        vals, ev, src = {}, dict(base.evidence), dict(base.sources)
        for k, p in (doc.get("parameters") or {}).items():
            if k in names:
                vals[k] = type(getattr(base, k))(p["value"]) if getattr(base, k) is not None else p["value"]
                ev[k] = "fitted"
                src[k] = ", ".join(p.get("source_runs", [])) or "calibration"
        learning = doc.get("learning") if (doc.get("learning") or {}).get("evidence") == "modeled" else base.learning
        return replace(base, **vals, evidence=ev, sources=src, learning=learning)


def payload_bytes_per_value(compression: str) -> int:
    return BYTES_PER_VALUE.get(compression, 4)


def link_one_way_s(cfg: RunConfig, src: str, dst: str, nbytes: int = 0) -> float:
    """Latency plus transmission of `nbytes` from src to dst (the link's `up` direction)."""
    prof = cfg.link_spec(f"{src}_to_{dst}").up
    bw = prof.bandwidth_kbps * 1000.0  # Toxiproxy's KB = 1000 bytes, per connection
    return prof.latency_ms / 1000.0 + (nbytes / bw if bw > 0 and nbytes else 0.0)


def collective_s(cfg: RunConfig, model: SimModel, members: tuple[str, ...], payload_values: int,
                 compression: str = "none") -> float:
    """Seconds of one all-reduce among `members`: reduce-scatter + all-gather (see the module doc)."""
    n = len(members)
    if n <= 1:
        return collective_end_s(model, n)
    shard_bytes = math.ceil(payload_values / n) * payload_bytes_per_value(compression)
    parts = max(1, math.ceil(shard_bytes / cfg.wan.chunk_bytes))
    # The slowest directed link governs each phase; with uniform links any pair stands for all.
    pairs = [(members[0], members[1]), (members[1], members[0])] if _uniform(cfg) else \
        [(a, b) for a in members for b in members if a != b]
    phase = max(link_one_way_s(cfg, a, b, shard_bytes) for a, b in pairs) + parts * model.collective_part_overhead_s
    return 2 * phase + collective_end_s(model, n)


def collective_end_s(model: SimModel, n: int) -> float:
    """The round's end on the sites among n members, beyond the links: a fixed part and one per peer
    (never below 0 s: a fitted line's intercept may be, inside its uncertainty)."""
    return max(0.0, model.collective_cpu_s + max(0, n - 1) * model.collective_per_peer_s)


def _uniform(cfg: RunConfig) -> bool:
    return not any(not name.endswith(("_to_coord", "_to_store")) for name, _ in cfg.wan.link_overrides)


def payload_bytes_sent(n: int, payload_values: int, compression: str = "none") -> int:
    """Bytes one site sends in one all-reduce: 2 (n-1)/n x P values."""
    if n <= 1:
        return 0
    return 2 * (n - 1) * math.ceil(payload_values / n) * payload_bytes_per_value(compression)


@functools.lru_cache(maxsize=64)
def all_reduce_payload(n: int, n_params: int, compression: str, chunk_bytes: int) -> tuple[int, int]:
    """(bytes one member sends, message parts) of one all-reduce among n members."""
    sent = payload_bytes_sent(n, n_params, compression)
    parts = 2 * (n - 1) * max(1, math.ceil(sent / max(1, 2 * (n - 1)) / chunk_bytes)) if n > 1 else 0
    return sent, parts


@functools.lru_cache(maxsize=8)
def cycle_extra(compute_s: float, h_steps: int, comm_s: float, sent: int, loss: float,
                update_cosine: float) -> dict[str, Any]:
    """A round report's `extra`: {"cycle": the site's SiteCycle}. Every member of a plain round reports
    the same timings: one (immutable) SiteCycle and one map for all (nothing writes to either)."""
    c = update_cosine
    return {"cycle": SiteCycle(float(compute_s), h_steps, float(comm_s), int(sent), float(loss), 1.0, float(c * c),
                               float(c), 0)}


def state_bytes(m: ModelConfig, cursor: int) -> int:
    """A site's packed state: params + AdamW moments + outer state (4 x P float32) + retained ids."""
    return sum(checkpoint_blob_bytes(m, cursor))


def checkpoint_blob_bytes(m: ModelConfig, cursor: int) -> tuple[int, int, int, int]:
    """The blobs a checkpoint uploads one after the other (site_agent/trainer.py state_tensors plus
    the lineage): model (P float32), inner AdamW moments (2P), outer state (P), retained ids (int64)."""
    p = n_params(m)
    return 4 * p, 8 * p, 4 * p, 8 * cursor
