"""One run's recovery timeline from its history: phases per site and marks for what happened.

Phases are spans the sites logged (both bounds, wall-clock ns):
  compute         `compute` spans (the inner steps of a round)
  collective      `collective` spans (the all-reduce across sites)
  state_transfer  `restore` spans that received state from a donor, or sent it to joiners
  checkpoint      `checkpoint_write` spans (blobs to the store)
  recovery        `restore` spans that rolled back or loaded the frontier from the store
  eval            `eval` spans (held-out loss)
  waiting         from a `paused` plan until the site's next membership (stall/restart waits)

Marks are points (or intervals) with the event that proves them:
  failure     a fault the chaos driver injected (bounds: injected .. healed), or the
              coordinator confirming a site failed
  preemption  a preemption the driver sent, the site announcing it, the coordinator's notice
  restore     a site restoring state (rollback, store, donor)
  replay      a site's first attempt, in an epoch, of samples that had been lost before
  rejoin      a new epoch that brings a site back (joiners), and the state it received

Times are wall-clock ns (every process on one host shares the clock; on several hosts NTP
bounds the skew); `t0_wall_ns` is the launcher's first event, so tracks of different runs
share one axis "seconds since run start".
"""

from __future__ import annotations

from typing import Any

from analysis.load import RunHistory
from ground.faults import drawn_as, site_kinds

PHASES = ("compute", "collective", "state_transfer", "checkpoint", "recovery", "eval", "waiting")
MARKS = ("failure", "preemption", "restore", "replay", "rejoin")

SITE_FAULTS = site_kinds()  # the fault kinds that act on one site (ground/faults.py)


def run_t0_ns(h: RunHistory) -> int:
    launcher = h.logs.get("launcher") or h.logs.get("prepare") or []
    if launcher:
        return int(launcher[0]["wall_ns"])
    return min(int(evs[0]["wall_ns"]) for evs in h.logs.values() if evs)


def run_end_ns(h: RunHistory) -> int:
    return max(int(e.get("end_wall_ns", e["wall_ns"])) for evs in h.logs.values() for e in evs[-50:])


def _target_site(target: Any, sites: list[str]) -> str | None:
    """The site a fault's target names first: 'b', 'b<->a', 'b->a', 'store', 'coord'."""
    if not isinstance(target, str):
        return None
    for sep in ("<->", "->"):
        if sep in target:
            target = target.split(sep)[0]
    return target if target in sites else None


def _phase_of_restore(e: dict[str, Any]) -> str | None:
    if e.get("source") == "donor" or e.get("sent_to"):
        return "state_transfer"
    if e.get("source") in ("store", "initial weights") or e.get("rolled_back"):
        return "recovery"
    return None  # a no-op restore (kind none, nothing rolled back)


SPAN_PHASES = {"compute": "compute", "collective": "collective", "checkpoint_write": "checkpoint", "eval": "eval"}


def extract_phases(h: RunHistory) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for site in h.sites:
        for name, phase in SPAN_PHASES.items():
            out.extend({"site": site, "phase": phase, "start_ns": e["start_wall_ns"], "end_ns": e["end_wall_ns"],
                        "event_id": e["id"]} for e in h.events(site, name) if "start_wall_ns" in e)
        for e in h.events(site, "restore"):
            phase = _phase_of_restore(e)
            if phase is not None and "start_wall_ns" in e:
                out.append({"site": site, "phase": phase, "start_ns": e["start_wall_ns"], "end_ns": e["end_wall_ns"],
                            "event_id": e["id"]})
        # Waiting: from a paused plan until the site's next membership (or its start or stop).
        turns = sorted(h.events(site, "paused") + h.events(site, "membership") + h.events(site, "site_started")
                       + h.events(site, "site_stopped"), key=lambda e: (e["wall_ns"], e["id"]))
        paused_since: dict[str, Any] | None = None
        for e in turns:
            if e["event"] == "paused":
                paused_since = paused_since or e
            elif paused_since is not None:
                out.append({"site": site, "phase": "waiting", "start_ns": int(paused_since["wall_ns"]),
                            "end_ns": int(e["wall_ns"]), "event_id": paused_since["id"]})
                paused_since = None
    return out


def _mark(site: str | None, kind: str, label: str, e: dict[str, Any], start_ns: int | None = None,
          end_ns: int | None = None) -> dict[str, Any]:
    s = int(start_ns if start_ns is not None else e.get("start_wall_ns", e["wall_ns"]))
    t = int(end_ns if end_ns is not None else e.get("end_wall_ns", e["wall_ns"]))
    return {"site": site, "kind": kind, "label": label, "event_id": e["id"], "process": e.get("process"),
            "start_ns": s, "end_ns": max(s, t)}


def replay_marks(first_replays: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A replay is an attempt at samples that an earlier attempt computed and then lost; one mark
    per (site, process, epoch): its first such attempt (found by analysis.summary.work_ledger)."""
    return [_mark(site, "replay", f"{site} redoes lost samples (epoch {e.get('epoch')}, round {e.get('round')})", e)
            for site, e in first_replays]


def extract_marks(h: RunHistory, first_replays: list[tuple[str, dict[str, Any]]] = ()) -> list[dict[str, Any]]:
    sites = h.sites
    marks: list[dict[str, Any]] = []
    healed = {}
    for e in h.logs.get("chaos", []):
        if e["event"] == "fault_healed":
            healed[e.get("fault")] = e
    for e in h.logs.get("chaos", []):
        if e["event"] != "fault_injected":
            continue
        kind = e.get("kind", "")
        site = _target_site(e.get("target"), sites)
        heal = healed.get(e.get("fault"))
        end = int(heal["wall_ns"]) if heal else None
        mk = drawn_as(kind)  # the kind's entry in ground/faults.py says how its injection is drawn
        marks.append(_mark(site, mk, f"{kind} {e.get('target', '')} injected", e, int(e["wall_ns"]), end))
    for e in h.logs.get("coord", []):
        ev = e["event"]
        if ev == "site_failed":
            marks.append(_mark(e.get("site"), "failure", f"coordinator: {e.get('site')} failed ({e.get('reason')})", e))
        elif ev == "preemption_notice":
            marks.append(_mark(e.get("site"), "preemption", f"coordinator: preemption notice from {e.get('site')}", e))
        elif ev == "membership_epoch" and e.get("joiners"):
            for j in e["joiners"]:
                marks.append(_mark(j, "rejoin", f"epoch {e['epoch']}: {j} rejoins ({e.get('restore')})", e))
    for site in sites:
        for e in h.logs.get(site, []):
            ev = e["event"]
            if ev == "preemption_announced":
                marks.append(_mark(site, "preemption", f"{site} announces its preemption", e))
            elif ev == "restore" and _phase_of_restore(e) is not None:
                src = e.get("source") or ("rollback" if e.get("rolled_back") else e.get("kind"))
                marks.append(_mark(site, "restore", f"{site} restores ({src}) to round {e.get('start_round')}", e))
            elif ev == "state_received":
                marks.append(_mark(site, "rejoin", f"{site} received state from {e.get('donor')}", e))
    marks.extend(replay_marks(list(first_replays)))
    marks.sort(key=lambda m: m["start_ns"])
    return marks


def frontier_progress(h: RunHistory, seq_len: int) -> list[dict[str, Any]]:
    """The durable frontier over time: (wall ns, useful tokens it holds), from the coordinator's record."""
    out = []
    for e in h.logs.get("coord", []):
        if e["event"] == "frontier":
            out.append({"wall_ns": int(e["wall_ns"]), "round": e.get("round"),
                        "useful_tokens": int(e.get("cursor", 0)) * seq_len, "event_id": e["id"],
                        "manifest_hash": e.get("manifest_hash")})
    return out
