"""The registry of every event a process writes to its log: its name, who writes it, its fields.

An event line is `{"id", "event", "wall_ns", "mono_ns", "run_id", "process", "pid", "epoch", "step",
...fields}` (ground/eventlog.py stamps the first nine). `EVENTS` names every event any module of this
repo emits, the modules that emit it, and the fields its call sites name (a span adds its four
bounds; some events add more fields from a record they carry, e.g. `commit`, or only sometimes). A new event is one
entry here: tests/{unit,live}/test_event_registry.py fails on an event emitted in the code, or found in a real
run's logs, that is not registered.
"""

from __future__ import annotations

from dataclasses import dataclass

# Stamped on every line; a field of the same name passed to emit() is dropped (`epoch` and `step`
# passed explicitly replace the log's context for that line).
STAMPED = ("id", "event", "wall_ns", "mono_ns", "run_id", "process", "pid", "epoch", "step")


@dataclass(frozen=True)
class Event:
    emitted_by: tuple[str, ...]  # modules
    span: bool  # written by EventLog.span: also start_wall_ns, end_wall_ns, start_mono_ns, end_mono_ns
    fields: tuple[str, ...] = ()  # named at the call sites (beyond STAMPED)


EVENTS: dict[str, Event] = {
    "baselines": Event(("xdc.cli", "cluster.launcher"), span=False,
        fields=()),
    "chaos_finish_failed": Event(("cluster.launcher",), span=False,
        fields=("error",)),
    "checkpoint_durable": Event(("checkpoint_store.service",), span=False,
        fields=("blobs", "bytes", "ckpt_id", "manifest_hash", "parent", "round", "src")),
    "checkpoint_failed": Event(("site_agent.agent", "site_agent.checkpointing"), span=False,
        fields=("reason", "round")),
    "checkpoint_load": Event(("checkpoint_store.client",), span=True,
        fields=("ckpt_id", "round")),
    "checkpoint_save": Event(("checkpoint_store.client",), span=True,
        fields=("ckpt_id", "round")),
    "checkpoint_write": Event(("site_agent.checkpointing",), span=True,
        fields=("round",)),
    "ckpt_chunk_received": Event(("checkpoint_store.service",), span=False,
        fields=("bytes", "chunks", "offset", "src", "upload")),
    "ckpt_request_failed": Event(("checkpoint_store.service",), span=False,
        fields=("kind", "msg_epoch", "reason", "req", "src")),
    "claim_pending": Event(("coordinator.claims",), span=False,
        fields=("detail", "reason", "reporter", "site")),
    "claim_refuted": Event(("coordinator.claims",), span=False,
        fields=("reason", "reporter", "site")),
    "collective": Event(("site_agent.rounds",), span=True,
        fields=("payload_values", "round")),
    "collective_aborted": Event(("site_agent.agent",), span=False,
        fields=("reason",)),
    "commit": Event(("coordinator.commits",), span=False,
        fields=()),
    "commit_refused": Event(("coordinator.commits",), span=False,
        fields=("hashes", "reason", "round")),
    "compute": Event(("site_agent.rounds",), span=True,
        fields=("round",)),
    "controller_decision": Event(("coordinator.commits",), span=False,
        fields=("action", "commit_epoch", "current", "evidence", "reason", "round", "setting")),
    "coord_input": Event(("coordinator.service",), span=False,
        fields=("body", "inc", "input", "kind", "lost", "msg_epoch", "now_ns", "rejected", "src")),
    "coordinator_recovered": Event(("coordinator.restart",), span=False,
        fields=("commits", "committed_cursor", "fence_epoch", "members", "pending_checkpoints",
                "recent_epochs", "records", "tip")),
    "coordinator_started": Event(("coordinator.service",), span=False,
        fields=("expected_sites", "journal_commits", "policy", "target_samples")),
    "coordinator_stopped": Event(("coordinator.service",), span=False,
        fields=("peak_rss_mib", "reason")),
    "cpu_by_process": Event(("telemetry.sampler",), span=False,
        fields=("cpu_s", "evidence", "source")),
    "cycle_observed": Event(("coordinator.commits",), span=False,
        fields=("round", "epoch", "setting", "inner_steps_h", "n_members", "members_changed", "t_step_s", "t_comm_s", "straggler_wait_s",
                "payload_bytes", "goodput_bps", "stalls", "loss", "cos_to_mean", "norm_ratio", "update_age_steps")),
    "eval": Event(("site_agent.agent", "site_agent.evaluator", "xdc.reference"), span=True,
        fields=("background", "cpu_s", "heldout_nll", "round", "useful_tokens_trained")),
    "fault_failed": Event(("chaos.driver",), span=False,
        fields=("error", "phase")),
    "fault_followup": Event(("chaos.driver",), span=False,
        fields=("result", "since_inject_s")),
    "fault_gate": Event(("site_agent.rounds",), span=False,
        fields=("gate_tokens", "outcome", "round", "waited_s")),
    "fault_gate_released": Event(("chaos.driver",), span=False,
        fields=("gate_tokens", "progress", "reason")),
    "fault_healed": Event(("chaos.driver",), span=False,
        fields=("result",)),
    "fault_injected": Event(("chaos.driver",), span=False,
        fields=("heal_at", "noop", "note", "params", "result")),
    "forkserver_skipped": Event(("cluster.launcher",), span=False,
        fields=("reason",)),
    "frame_rejected": Event(("wan.receiver", "wan.monitor"), span=False,
        fields=("bytes", "code", "detail", "kind", "link", "msg_epoch", "msg_run", "peer", "reason", "src")),
    "frontier": Event(("coordinator.working",), span=False,
        fields=()),
    "frontier_deferred": Event(("coordinator.rules",), span=False,
        fields=("cursor", "manifest_hash", "reason", "round")),
    "handshake_failed": Event(("wan.monitor",), span=False,
        fields=("code", "link", "peer", "zmq_event")),
    "heartbeat_stats": Event(("coordinator.service",), span=False,
        fields=("sites",)),
    "idle_baseline": Event(("telemetry.sampler",), span=False,
        fields=("which",)),
    "intra_site_check": Event(("site_agent.worker",), span=False,
        fields=("mismatched_ranks", "params_hash", "passed", "round", "world")),
    "intra_site_failure": Event(("site_agent.agent",), span=False,
        fields=("reason",)),
    "intra_site_group": Event(("site_agent.worker",), span=False,
        fields=("backend", "connect_s", "world")),
    "intra_site_join": Event(("site_agent.worker",), span=True,
        fields=("master_port",)),
    "join_deferred": Event(("coordinator.rules",), span=False,
        fields=("reason", "site")),
    "journal_torn_tail": Event(("coordinator.restart",), span=False,
        fields=("detail",)),
    "link_down": Event(("wan.monitor",), span=False,
        fields=("in_doubt_bytes", "link", "peer")),
    "link_up": Event(("wan.monitor",), span=False,
        fields=("link", "peer", "reconnect")),
    "membership": Event(("site_agent.adoption",), span=False,
        fields=("donor", "joiners", "members", "paused", "restore", "start_cursor", "start_round")),
    "membership_decision": Event(("coordinator.rules",), span=False,
        fields=("action", "reason", "site")),
    "membership_epoch": Event(("coordinator.rules",), span=False,
        fields=("donor", "drain", "joiners", "manifest_hash", "members", "parent_commit", "paused", "policy",
                "reason", "recovered_from_journal", "restore", "start_cursor", "start_round")),
    "membership_skipped": Event(("site_agent.agent",), span=False,
        fields=("reason", "skipped_epoch", "start_round")),
    "message_rejected": Event(("site_agent.agent", "site_agent.collective", "site_agent.adoption"), span=False,
        fields=("detail", "kind", "msg_epoch", "reason", "src", "waiting_round")),
    "not_a_member": Event(("site_agent.adoption",), span=False,
        fields=()),
    "parked_sent": Event(("wan.sender",), span=False,
        fields=("dest", "messages", "reason")),
    "paused": Event(("site_agent.adoption",), span=False,
        fields=("reason",)),
    "peer_disconnected": Event(("wan.monitor",), span=False,
        fields=("fd", "link", "peer")),
    "peer_reconnected": Event(("wan.monitor",), span=False,
        fields=("peer", "silent_ms")),
    "peer_unreachable": Event(("site_agent.agent",), span=False,
        fields=("detail", "peer")),
    "periodic_task_failed": Event(("wan.node",), span=False,
        fields=("error",)),
    "preemption_announced": Event(("site_agent.agent",), span=False,
        fields=("round",)),
    "preemption_notice": Event(("coordinator.rules",), span=False,
        fields=("checkpoint_first", "grace_s", "reason", "site")),
    "process_started": Event(("cluster.launcher",), span=False,
        fields=("api", "child_pid", "module", "name", "warm_standby")),
    "proxy_counters": Event(("xdc.cli", "xdc.finish", "cluster.launcher"), span=False,
        fields=("proxies", "source")),
    "proxy_created": Event(("cluster.launcher",), span=False,
        fields=("listen", "proxy", "toxics", "upstream")),
    "proxy_port_taken": Event(("cluster.launcher",), span=False,
        fields=("proxy", "retry", "tried")),
    "recovery_decision": Event(("coordinator.rules",), span=False,
        fields=("new_epoch", "policy", "reason")),
    "recovery_settled": Event(("coordinator.rules",), span=False,
        fields=("committed_round", "reason", "tip")),
    "reference_done": Event(("xdc.reference",), span=False,
        fields=("final_heldout_nll", "useful_tokens")),
    "reference_started": Event(("xdc.reference",), span=False,
        fields=("dataset_id", "global_batch_samples", "n_sites", "seed")),
    "rejoin_answered": Event(("coordinator.rules",), span=False,
        fields=("incarnation", "msg_epoch", "reason", "site", "state")),
    "report_rejected": Event(("coordinator.working", "coordinator.service"), span=False,
        fields=("kind", "msg_epoch", "reason", "site", "src")),
    "restore": Event(("site_agent.adoption",), span=True,
        fields=("kind", "start_round")),
    "restore_abandoned": Event(("site_agent.agent",), span=False,
        fields=("reason",)),
    "restore_failed": Event(("site_agent.agent",), span=False,
        fields=("error",)),
    "retransmit": Event(("wan.sender",), span=False,
        fields=("dest", "messages", "reason", "wire_bytes")),
    "round_abandoned": Event(("site_agent.agent",), span=False,
        fields=("reason", "round")),
    "round_done": Event(("site_agent.rounds",), span=False,
        fields=("cursor_end", "cursor_start", "param_hash", "retained_samples", "round", "samples_sha256")),
    "run_complete": Event(("coordinator.rules",), span=False,
        fields=("commits", "tip", "useful_tokens")),
    "run_finished": Event(("cluster.launcher",), span=False,
        fields=("exit_codes", "interrupted", "timed_out")),
    "run_sampled": Event(("telemetry.sampler",), span=False,
        fields=("missed_polls",)),
    "run_started": Event(("xdc.cli", "cluster.launcher"), span=False,
        fields=()),
    "sampler_error": Event(("telemetry.sampler",), span=False,
        fields=("error",)),
    "sampler_not_ready": Event(("telemetry.launch",), span=False,
        fields=("exit_code", "interrupted", "waited_s")),
    "sampler_ready": Event(("telemetry.sampler",), span=False,
        fields=()),
    "sampler_started": Event(("telemetry.sampler",), span=False,
        fields=("config", "idle_baseline_s", "poll_period_ms", "trace")),
    "scenario_finished": Event(("chaos.driver",), span=False,
        fields=("failed", "never_fired", "progress", "scenario", "started", "statuses", "t_s", "taken_down")),
    "scenario_started": Event(("chaos.driver",), span=False,
        fields=("clock_s", "description", "faults", "n_faults", "noop", "scenario", "seed", "started_by")),
    "send_dropped": Event(("wan.sender",), span=False,
        fields=("dest", "kind_cls", "reason")),
    "send_failed": Event(("wan.sender",), span=False,
        fields=("dest", "reason")),
    "send_refused": Event(("wan.node", "wan.receiver"), span=False,
        fields=("dest", "kind", "reason")),
    "sensor_status": Event(("telemetry.sampler",), span=False,
        fields=("detail", "point", "previous", "sensor", "status")),
    "sensor_support": Event(("telemetry.sampler",), span=False,
        fields=()),
    "setting_changed": Event(("coordinator.rules",), span=False,
        fields=("new", "old", "reason", "start_cursor", "start_round", "start_step")),
    "setting_entered": Event(("site_agent.rounds",), span=False,
        fields=("action", "round", "setting")),
    "signal": Event(("coordinator.service", "site_agent.agent", "telemetry.sampler"), span=False,
        fields=("signal",)),
    "site_done": Event(("coordinator.rules",), span=False,
        fields=("round", "site")),
    "site_failed": Event(("coordinator.rules", "coordinator.claims"), span=False,
        fields=("reason", "site")),
    "site_joined": Event(("coordinator.rules",), span=False,
        fields=("incarnation", "previous_state", "site_pid", "site", "state")),
    "site_metrics": Event(("coordinator.rules",), span=False,
        fields=("metrics", "site")),
    "site_started": Event(("site_agent.agent",), span=False,
        fields=("dataset_id", "device", "flops_per_token", "init_state", "n_params", "params_hash", "threads",
                "torch", "warm_standby", "workers_per_site")),
    "standby_started": Event(("cluster.launcher",), span=False,
        fields=("child_pid", "output")),
    "standby_unusable": Event(("cluster.launcher",), span=False,
        fields=("reason", "site")),
    "site_stopped": Event(("site_agent.agent",), span=False,
        fields=("peak_rss_mib", "rc", "reason")),
    "site_suspected": Event(("coordinator.rules",), span=False,
        fields=("reason", "site")),
    "state_received": Event(("site_agent.adoption",), span=False,
        fields=("bytes", "donor", "params_hash", "round", "samples_sha256")),
    "state_sent": Event(("site_agent.adoption",), span=False,
        fields=("bytes", "joiner", "params_hash", "round", "samples_sha256")),
    "store_failed": Event(("checkpoint_store.service",), span=False,
        fields=("error",)),
    "store_fence_raised": Event(("checkpoint_store.service",), span=False,
        fields=("fence_epoch", "kind", "src")),
    "store_reply_rejected": Event(("checkpoint_store.client",), span=False,
        fields=("kind", "reason", "req", "src")),
    "store_started": Event(("checkpoint_store.service",), span=False,
        fields=("bind", "fence_epoch", "frontier", "frontier_error", "removed", "root")),
    "store_stopped": Event(("checkpoint_store.service",), span=False,
        fields=("peak_rss_mib", "reason")),
    "suspicion_cleared": Event(("coordinator.rules",), span=False,
        fields=("reason", "site")),
    "superseded_dropped": Event(("wan.sender",), span=False,
        fields=("dest", "fence_epoch", "messages", "peer_inc", "wire_bytes")),
    "target_reached": Event(("site_agent.rounds",), span=False,
        fields=("round",)),
    "trace_closed": Event(("telemetry.sampler",), span=False,
        fields=("bytes", "missed_polls", "path", "points", "reason", "sampler_cpu_s", "sha256")),
    "wan_counters": Event(("checkpoint_store.service", "coordinator.service", "site_agent.adoption", "site_agent.agent", "site_agent.rounds",
                           "sim.wan_bytes"), span=False,
        fields=("counters",)),
    "wan_close_incomplete": Event(("wan.node",), span=False,
        fields=("reason", "timeout_s")),
    "wan_thread_crashed": Event(("wan.node",), span=False,
        fields=("error", "exit_code")),
    "work_attempted": Event(("site_agent.rounds",), span=False,
        fields=("flops", "inner_step", "round", "samples", "tokens")),
    "work_carried": Event(("site_agent.adoption",), span=False,
        fields=("from_epoch", "inner_step", "round", "samples", "tokens")),
    "worker_compute": Event(("site_agent.worker",), span=True,
        fields=("round",)),
    "worker_round": Event(("site_agent.worker",), span=False,
        fields=("agrees_with_rank0", "param_hash", "round", "samples", "site_loss")),
    "worker_started": Event(("site_agent.worker",), span=False,
        fields=("device", "parent_pid", "rank", "site", "threads", "world")),
    "worker_stopped": Event(("site_agent.worker",), span=False,
        fields=("rc", "reason")),
    "workers_spawned": Event(("site_agent.worker",), span=False,
        fields=("master_port", "pids", "threads_per_worker", "world")),
    "workers_stopped": Event(("site_agent.worker",), span=False,
        fields=("exit_codes", "reason", "sent_stop")),
    "write_rejected": Event(("checkpoint_store.service",), span=False,
        fields=("fence_epoch", "kind", "msg_epoch", "reason", "req", "src")),
}


def is_registered(name: str) -> bool:
    return name in EVENTS


# The stamped fields' types (bool is not an int here: JSON `true` is no timestamp).
_STAMPED_TYPES: dict[str, type] = {"id": str, "event": str, "wall_ns": int, "mono_ns": int, "run_id": str,
                                   "process": str, "pid": int, "epoch": int, "step": int}
SPAN_BOUNDS = ("start_wall_ns", "end_wall_ns", "start_mono_ns", "end_mono_ns")


def _type_name(v: object) -> str:
    return "null" if v is None else type(v).__name__


_SPANS = frozenset(name for name, e in EVENTS.items() if e.span)


def _well_formed(ev: dict) -> bool:
    """The fast path of envelope_problem (every event analysed goes through it)."""
    try:
        ok = (type(ev["id"]) is str and type(ev["event"]) is str and type(ev["wall_ns"]) is int
              and type(ev["mono_ns"]) is int and type(ev["run_id"]) is str and type(ev["process"]) is str
              and type(ev["pid"]) is int and type(ev["epoch"]) is int and type(ev["step"]) is int)
        if ok and ev["event"] in _SPANS:
            ok = (type(ev["start_wall_ns"]) is int and type(ev["end_wall_ns"]) is int
                  and type(ev["start_mono_ns"]) is int and type(ev["end_mono_ns"]) is int
                  and ev["end_mono_ns"] >= ev["start_mono_ns"])
    except KeyError:
        return False
    return ok


def envelope_ok(ev: dict) -> bool:
    """True when envelope_problem(ev) is None."""
    return _well_formed(ev)


def envelope_problem(ev: dict) -> str | None:
    """What is wrong with an event line's envelope, or None: a stamped field missing or of the wrong
    type (a non-integer `mono_ns` would sort or subtract wrongly in every ledger), and for a
    registered span event, a missing or non-integer bound or one that ends before it starts."""
    if _well_formed(ev):
        return None
    for k, t in _STAMPED_TYPES.items():
        if k not in ev:
            return f"no '{k}' field"
        v = ev[k]
        if not isinstance(v, t) or isinstance(v, bool):
            return f"'{k}' is {_type_name(v)} {v!r:.40}, not {t.__name__}"
    reg = EVENTS.get(ev["event"])
    if reg is not None and reg.span:
        for k in SPAN_BOUNDS:
            v = ev.get(k)
            if not isinstance(v, int) or isinstance(v, bool):
                return f"span bound '{k}' is {_type_name(v)}, not int"
        if ev["end_mono_ns"] < ev["start_mono_ns"]:
            return f"span ends before it starts ({ev['end_mono_ns']} < {ev['start_mono_ns']} mono_ns)"
    return None
