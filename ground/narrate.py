"""One human line per event a person cares about: the words of a run's live output.

A process started with `XDC_NARRATE=1` (every compose service) prints these lines on stdout as it
logs the events (ground/eventlog.py); the native launcher's live display shows the same lines
(cluster/progress.py). JSON stays in the log files; this is a view of them, never a second record.

`Narrator` is pure and per process: `line(event) -> str | None`. It keeps what a later line needs
(the target, the members' latest train loss), so a commit line can say how far the run is and what
the loss is without the coordinator knowing the loss itself.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

Event = Mapping[str, Any]


def _list(names: Any) -> str:
    return ", ".join(str(n) for n in names) if names else "none"


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _setting(s: Any) -> str:
    if not isinstance(s, Mapping):
        return "?"
    h = s.get("inner_steps_h")
    comp = s.get("compression") or "none"
    return f"{s.get('mode', '?')} H={h}" + ("" if comp == "none" else f" {comp}")


class Narrator:
    """The lines of one process's events (the process is the event's `process` field)."""

    def __init__(self) -> None:
        self.target_tokens: int | None = None
        self.loss: dict[str, float] = {}  # site -> its latest reported mean train loss (coordinator side)

    def line(self, ev: Event) -> str | None:
        name = ev.get("event")
        fn = getattr(self, f"_{ev.get('process')}_{name}", None) or getattr(self, f"_any_{name}", None)
        if fn is None:
            return None
        return fn(ev)

    # -- coordinator ---------------------------------------------------------------------------
    def _coord_coordinator_started(self, ev: Event) -> str:
        if isinstance(ev.get("target_tokens"), int):
            self.target_tokens = ev["target_tokens"]
        target = f", target {self.target_tokens:,} useful tokens" if self.target_tokens else ""
        return f"coordinator started: policy {ev.get('policy')}, expecting sites {_list(ev.get('expected_sites'))}{target}"

    def _coord_coordinator_recovered(self, ev: Event) -> str:
        return "coordinator restarted: state recovered from its journal"

    def _coord_site_joined(self, ev: Event) -> str:
        return f"site {ev.get('site')} joined"

    def _coord_membership_epoch(self, ev: Event) -> str:
        head = f"epoch {ev.get('epoch')}"
        if ev.get("paused"):
            return f"{head}: paused ({ev.get('reason')})"
        restore = ev.get("restore")
        how = "" if restore in (None, "none") else f", restore from {restore}" + (
            f" (donor {ev['donor']})" if ev.get("donor") else "")
        return (f"{head} formed: members {_list(ev.get('members'))}, from round {ev.get('start_round')}, "
                f"{_setting(ev.get('setting'))}{how} ({ev.get('reason')})")

    def _coord_site_metrics(self, ev: Event) -> None:
        loss = _num((ev.get("metrics") or {}).get("loss"))
        if loss is not None:
            self.loss[str(ev.get("site"))] = loss
        return None

    def _coord_commit(self, ev: Event) -> str:
        useful = int(ev.get("useful_tokens") or 0)
        progress = f"{useful:,} useful tokens"
        if self.target_tokens:
            progress = f"{useful:,} of {self.target_tokens:,} useful tokens ({100 * useful / self.target_tokens:.0f} %)"
        members = list(ev.get("members") or [])
        losses = [self.loss[m] for m in members if m in self.loss]
        loss = f", train loss {sum(losses) / len(losses):.3f}" if losses else ", train loss -"
        return f"round {ev.get('round')} committed by {_list(members)}: {progress}{loss}"

    def _coord_site_failed(self, ev: Event) -> str:
        return f"site {ev.get('site')} failed: {ev.get('reason')}"

    def _coord_recovery_decision(self, ev: Event) -> str | None:
        if not ev.get("new_epoch"):
            return None
        return f"recovery ({ev.get('policy')}): {ev.get('reason')}"

    def _coord_preemption_notice(self, ev: Event) -> str:
        return f"site {ev.get('site')} announced its preemption (grace {ev.get('grace_s')} s)"

    def _coord_frontier(self, ev: Event) -> str:
        return f"frontier: the checkpoint of round {ev.get('round')} is durable ({ev.get('commit_id')})"

    def _coord_setting_changed(self, ev: Event) -> str:
        return f"setting changed: {_setting(ev.get('old'))} -> {_setting(ev.get('new'))} ({ev.get('reason')})"

    def _coord_run_complete(self, ev: Event) -> str:
        return (f"run complete: {int(ev.get('useful_tokens') or 0):,} useful tokens in {ev.get('commits')} commits "
                f"(tip {ev.get('tip')})")

    def _coord_coordinator_stopped(self, ev: Event) -> str:
        return f"coordinator stopped ({ev.get('reason')})"

    # -- sites ---------------------------------------------------------------------------------
    def _any_site_started(self, ev: Event) -> str:
        n = ev.get("n_params")
        return f"site {ev.get('process')} started on {ev.get('device')}" + (f", {n:,} parameters" if isinstance(n, int) else "")

    def _any_eval(self, ev: Event) -> str | None:
        nll = _num(ev.get("heldout_nll"))
        if nll is None:
            return None
        trained = ev.get("useful_tokens_trained")
        after = f" after {trained:,} useful tokens" if isinstance(trained, int) else ""
        return f"site {ev.get('process')}: held-out NLL {nll:.3f}{after}"

    def _any_state_received(self, ev: Event) -> str:
        return f"site {ev.get('process')}: state of round {ev.get('round')} received from {ev.get('donor')}"

    def _any_restore_failed(self, ev: Event) -> str:
        return f"site {ev.get('process')}: restore failed: {ev.get('reason') or ev.get('error')}"

    def _any_site_stopped(self, ev: Event) -> str:
        return f"site {ev.get('process')} stopped: {ev.get('reason')}"

    # -- store, sampler, chaos -----------------------------------------------------------------
    def _store_store_started(self, ev: Event) -> str:
        return "checkpoint store started" + (f" (frontier {ev['frontier']})" if ev.get("frontier") else "")

    def _store_checkpoint_durable(self, ev: Event) -> str:
        size = _num(ev.get("bytes"))
        mb = f", {size / 1e6:.1f} MB" if size is not None else ""
        return f"checkpoint {ev.get('ckpt_id')} of round {ev.get('round')} durable in the store{mb}"

    def _store_store_stopped(self, ev: Event) -> str:
        return f"checkpoint store stopped ({ev.get('reason')})"

    def _telemetry_sampler_ready(self, ev: Event) -> str:
        return "energy sampler ready (idle baseline measured)"

    def _telemetry_trace_closed(self, ev: Event) -> str:
        return f"energy trace closed: {ev.get('points')} points ({ev.get('reason')})"

    def _chaos_scenario_started(self, ev: Event) -> str:
        return f"chaos: scenario {ev.get('scenario')} started, {ev.get('n_faults')} fault(s)"

    def _chaos_fault_injected(self, ev: Event) -> str:
        return f"chaos: fault {ev.get('fault')} injected: {ev.get('kind')} on {ev.get('target')}"

    def _chaos_fault_healed(self, ev: Event) -> str:
        return f"chaos: fault {ev.get('fault')} healed: {ev.get('kind')} on {ev.get('target')} ({ev.get('reason')})"

    def _chaos_scenario_finished(self, ev: Event) -> str:
        never = ev.get("never_fired") or []
        return f"chaos: scenario {ev.get('scenario')} finished" + (f"; never fired: {_list(never)}" if never else "")
